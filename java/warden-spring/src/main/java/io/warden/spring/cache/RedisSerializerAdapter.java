package io.warden.spring.cache;

import org.springframework.data.redis.serializer.RedisSerializer;

/** A spring-data-redis {@link RedisSerializer} as a {@link CacheValueSerializer}. */
public final class RedisSerializerAdapter implements CacheValueSerializer {
  private final RedisSerializer<Object> serializer;

  private RedisSerializerAdapter(RedisSerializer<Object> serializer) {
    this.serializer = serializer;
  }

  /** {@code serializer} for cached values ({@code RedisSerializer.json()}, ...). */
  @SuppressWarnings("unchecked")
  public static CacheValueSerializer of(RedisSerializer<?> serializer) {
    if (serializer == null) {
      throw new IllegalArgumentException("serializer must not be null");
    }
    return new RedisSerializerAdapter((RedisSerializer<Object>) serializer);
  }

  @Override
  public byte[] serialize(Object value) {
    byte[] bytes = serializer.serialize(value);
    if (bytes == null) {
      throw new IllegalArgumentException(serializer + " wrote nothing for " + value);
    }
    return bytes;
  }

  @Override
  public Object deserialize(byte[] bytes) {
    return serializer.deserialize(bytes);
  }
}
