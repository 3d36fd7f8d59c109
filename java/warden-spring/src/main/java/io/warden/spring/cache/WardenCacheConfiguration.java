package io.warden.spring.cache;

import java.time.Duration;
import java.util.function.Function;

/**
 * How one {@link WardenCache} stores its entries: time to live, whether {@code null} is cached, the
 * key prefix and the value serializer. Immutable; each {@code with...} method returns a copy.
 *
 * <p>Defaults, as {@code RedisCacheConfiguration.defaultCacheConfig()}: entries never expire, null
 * values are cached, keys are {@code cacheName::key}, values use Java serialization.
 */
public final class WardenCacheConfiguration {
  private static final Function<String, String> SIMPLE_PREFIX = name -> name + "::";

  private final Duration ttl;
  private final boolean cacheNullValues;
  private final Function<String, String> keyPrefix;
  private final CacheValueSerializer serializer;

  private WardenCacheConfiguration(
      Duration ttl,
      boolean cacheNullValues,
      Function<String, String> keyPrefix,
      CacheValueSerializer serializer) {
    this.ttl = ttl;
    this.cacheNullValues = cacheNullValues;
    this.keyPrefix = keyPrefix;
    this.serializer = serializer;
  }

  public static WardenCacheConfiguration defaultCacheConfig() {
    return new WardenCacheConfiguration(
        Duration.ZERO, true, SIMPLE_PREFIX, CacheValueSerializer.java());
  }

  /** Entries expire {@code ttl} after they are stored; {@code Duration.ZERO}: never. */
  public WardenCacheConfiguration entryTtl(Duration ttl) {
    if (ttl == null || ttl.isNegative()) {
      throw new IllegalArgumentException("ttl must be zero (no expiry) or positive");
    }
    return new WardenCacheConfiguration(ttl, cacheNullValues, keyPrefix, serializer);
  }

  /** A loader's {@code null} is not cached: such a call loads again next time. */
  public WardenCacheConfiguration disableCachingNullValues() {
    return new WardenCacheConfiguration(ttl, false, keyPrefix, serializer);
  }

  /** Keys are {@code prefix + cacheName + "::" + key}. */
  public WardenCacheConfiguration prefixCacheNameWith(String prefix) {
    return computePrefixWith(name -> prefix + name + "::");
  }

  /** Keys are {@code prefix.apply(cacheName) + key}. */
  public WardenCacheConfiguration computePrefixWith(Function<String, String> prefix) {
    if (prefix == null) {
      throw new IllegalArgumentException("prefix must not be null");
    }
    return new WardenCacheConfiguration(ttl, cacheNullValues, prefix, serializer);
  }

  /**
   * Keys are the cache keys themselves, shared by every cache of that configuration. {@link
   * WardenCache#clear()} then refuses to run: it would delete the whole database.
   */
  public WardenCacheConfiguration disableKeyPrefix() {
    return new WardenCacheConfiguration(ttl, cacheNullValues, null, serializer);
  }

  public WardenCacheConfiguration serializeValuesWith(CacheValueSerializer serializer) {
    if (serializer == null) {
      throw new IllegalArgumentException("serializer must not be null");
    }
    return new WardenCacheConfiguration(ttl, cacheNullValues, keyPrefix, serializer);
  }

  public Duration getTtl() {
    return ttl;
  }

  public boolean getAllowCacheNullValues() {
    return cacheNullValues;
  }

  public boolean usePrefix() {
    return keyPrefix != null;
  }

  /** The key prefix of the cache named {@code cacheName} ({@code ""} without a prefix). */
  public String getKeyPrefixFor(String cacheName) {
    return keyPrefix == null ? "" : keyPrefix.apply(cacheName);
  }

  public CacheValueSerializer getSerializer() {
    return serializer;
  }
}
