package io.warden.spring.cache;

import org.springframework.core.serializer.support.DeserializingConverter;
import org.springframework.core.serializer.support.SerializingConverter;

/** Java serialization, through Spring's converters (as {@code JdkSerializationRedisSerializer}). */
final class JdkCacheValueSerializer implements CacheValueSerializer {
  private final SerializingConverter serializer = new SerializingConverter();
  private final DeserializingConverter deserializer;

  JdkCacheValueSerializer(ClassLoader classLoader) {
    this.deserializer =
        classLoader == null
            ? new DeserializingConverter()
            : new DeserializingConverter(classLoader);
  }

  @Override
  public byte[] serialize(Object value) {
    return serializer.convert(value);
  }

  @Override
  public Object deserialize(byte[] bytes) {
    return deserializer.convert(bytes);
  }
}
