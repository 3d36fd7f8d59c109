package io.warden;

/** Turns cached values into bytes and back, for {@link WardenCache#getOrLoad}. */
public interface Codec<T> {
  byte[] encode(T value);

  T decode(byte[] bytes);
}
