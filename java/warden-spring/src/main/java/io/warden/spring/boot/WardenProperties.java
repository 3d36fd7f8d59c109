package io.warden.spring.boot;

import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.springframework.boot.context.properties.ConfigurationProperties;

/** {@code warden.*}: the cache manager's and the lock registry's settings. */
@ConfigurationProperties("warden")
public class WardenProperties {
  private final Cache cache = new Cache();
  private final Lock lock = new Lock();

  public Cache getCache() {
    return cache;
  }

  public Lock getLock() {
    return lock;
  }

  /** {@code warden.cache.*}. */
  public static class Cache {
    /** Entries' time to live (none: they never expire). */
    private Duration timeToLive;

    /** Whether a loader's null is cached. */
    private boolean cacheNullValues = true;

    /** A prefix before {@code cacheName::} in every key. */
    private String keyPrefix;

    /** Whether keys carry {@code cacheName::} (and {@link #keyPrefix}). */
    private boolean useKeyPrefix = true;

    /** Caches made at start; with names here, no other cache is made on first use. */
    private List<String> cacheNames = new ArrayList<>();

    /** Per cache name: its own time to live. */
    private Map<String, Duration> timeToLiveByCache = new LinkedHashMap<>();

    public Duration getTimeToLive() {
      return timeToLive;
    }

    public void setTimeToLive(Duration timeToLive) {
      this.timeToLive = timeToLive;
    }

    public boolean isCacheNullValues() {
      return cacheNullValues;
    }

    public void setCacheNullValues(boolean cacheNullValues) {
      this.cacheNullValues = cacheNullValues;
    }

    public String getKeyPrefix() {
      return keyPrefix;
    }

    public void setKeyPrefix(String keyPrefix) {
      this.keyPrefix = keyPrefix;
    }

    public boolean isUseKeyPrefix() {
      return useKeyPrefix;
    }

    public void setUseKeyPrefix(boolean useKeyPrefix) {
      this.useKeyPrefix = useKeyPrefix;
    }

    public List<String> getCacheNames() {
      return cacheNames;
    }

    public void setCacheNames(List<String> cacheNames) {
      this.cacheNames = cacheNames;
    }

    public Map<String, Duration> getTimeToLiveByCache() {
      return timeToLiveByCache;
    }

    public void setTimeToLiveByCache(Map<String, Duration> timeToLiveByCache) {
      this.timeToLiveByCache = timeToLiveByCache;
    }
  }

  /** {@code warden.lock.*}. */
  public static class Lock {
    /** The registry's key prefix: locks are {@code registryKey:key}. */
    private String registryKey = "lock";

    /** Every hold's lease (none: a watchdog renews holds while they are held). */
    private Duration expireAfter;

    public String getRegistryKey() {
      return registryKey;
    }

    public void setRegistryKey(String registryKey) {
      this.registryKey = registryKey;
    }

    public Duration getExpireAfter() {
      return expireAfter;
    }

    public void setExpireAfter(Duration expireAfter) {
      this.expireAfter = expireAfter;
    }
  }
}
