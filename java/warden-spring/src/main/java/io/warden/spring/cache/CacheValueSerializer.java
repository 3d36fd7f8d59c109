package io.warden.spring.cache;

/**
 * Turns cached values into the bytes stored on the server and back. The default is Java
 * serialization ({@link #java()}), as {@code RedisCache}'s; {@link RedisSerializerAdapter} takes
 * any spring-data-redis {@code RedisSerializer} (JSON, ...).
 */
public interface CacheValueSerializer {
  byte[] serialize(Object value);

  Object deserialize(byte[] bytes);

  /** Java serialization with the default class loader. */
  static CacheValueSerializer java() {
    return new JdkCacheValueSerializer(null);
  }

  /** Java serialization resolving classes with {@code classLoader}. */
  static CacheValueSerializer java(ClassLoader classLoader) {
    return new JdkCacheValueSerializer(classLoader);
  }
}
