package io.warden.spring.cache;

import io.warden.Warden;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.springframework.cache.Cache;
import org.springframework.cache.support.AbstractCacheManager;

/**
 * A Spring {@link org.springframework.cache.CacheManager} of {@link WardenCache}s, shaped like
 * {@code RedisCacheManager}: a default {@link WardenCacheConfiguration}, one per cache name where
 * it differs (its TTL, ...), and caches made on first use unless that is disabled.
 *
 * <pre>{@code
 * WardenCacheManager manager = WardenCacheManager.builder(warden)
 *     .cacheDefaults(WardenCacheConfiguration.defaultCacheConfig().entryTtl(Duration.ofMinutes(10)))
 *     .withCacheConfiguration("users", WardenCacheConfiguration.defaultCacheConfig()
 *         .entryTtl(Duration.ofMinutes(1)))
 *     .build();
 * }</pre>
 */
public class WardenCacheManager extends AbstractCacheManager {
  private final Warden warden;
  private final WardenCacheConfiguration defaults;
  private final Map<String, WardenCacheConfiguration> initial;
  private final boolean createOnMissingCache;

  public WardenCacheManager(Warden warden) {
    this(warden, WardenCacheConfiguration.defaultCacheConfig(), Collections.emptyMap(), true);
  }

  public WardenCacheManager(
      Warden warden,
      WardenCacheConfiguration defaults,
      Map<String, WardenCacheConfiguration> initial,
      boolean createOnMissingCache) {
    if (warden == null || defaults == null || initial == null) {
      throw new IllegalArgumentException("warden, defaults and initial must not be null");
    }
    this.warden = warden;
    this.defaults = defaults;
    this.initial = new LinkedHashMap<>(initial);
    this.createOnMissingCache = createOnMissingCache;
  }

  public static Builder builder(Warden warden) {
    return new Builder(warden);
  }

  @Override
  protected Collection<? extends Cache> loadCaches() {
    List<WardenCache> caches = new ArrayList<>();
    initial.forEach((name, config) -> caches.add(createCache(name, config)));
    return caches;
  }

  @Override
  protected Cache getMissingCache(String name) {
    if (!createOnMissingCache) {
      return null;
    }
    return createCache(name, initial.getOrDefault(name, defaults));
  }

  protected WardenCache createCache(String name, WardenCacheConfiguration config) {
    return new WardenCache(name, warden, config);
  }

  /** The configuration of each cache made at start, by name. */
  public Map<String, WardenCacheConfiguration> getCacheConfigurations() {
    Map<String, WardenCacheConfiguration> all = new LinkedHashMap<>();
    for (String name : getCacheNames()) {
      Cache cache = lookupCache(name);
      if (cache instanceof WardenCache w) {
        all.put(name, w.getCacheConfiguration());
      }
    }
    return Collections.unmodifiableMap(all);
  }

  public WardenCacheConfiguration getDefaultCacheConfiguration() {
    return defaults;
  }

  /** Builds a {@link WardenCacheManager}. */
  public static final class Builder {
    private final Warden warden;
    private WardenCacheConfiguration defaults = WardenCacheConfiguration.defaultCacheConfig();
    private final Map<String, WardenCacheConfiguration> initial = new LinkedHashMap<>();
    private boolean createOnMissingCache = true;

    private Builder(Warden warden) {
      this.warden = warden;
    }

    /** The configuration of caches not named in {@link #withCacheConfiguration}. */
    public Builder cacheDefaults(WardenCacheConfiguration defaults) {
      this.defaults = defaults;
      return this;
    }

    public WardenCacheConfiguration cacheDefaults() {
      return defaults;
    }

    /** Caches made at start with the default configuration. */
    public Builder initialCacheNames(Collection<String> names) {
      names.forEach(n -> initial.putIfAbsent(n, null)); // null: the defaults, as built
      return this;
    }

    public Builder withCacheConfiguration(String name, WardenCacheConfiguration config) {
      initial.put(name, config);
      return this;
    }

    /** Only the caches named at start exist; {@code getCache} of another name returns null. */
    public Builder disableCreateOnMissingCache() {
      this.createOnMissingCache = false;
      return this;
    }

    public WardenCacheManager build() {
      Map<String, WardenCacheConfiguration> configs = new LinkedHashMap<>();
      initial.forEach((n, c) -> configs.put(n, c == null ? defaults : c));
      return new WardenCacheManager(warden, defaults, configs, createOnMissingCache);
    }
  }
}
