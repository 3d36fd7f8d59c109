package io.warden;

import java.time.Duration;

/** Permits of a semaphore held under one owner; released from any thread. */
public interface Permit extends AutoCloseable {
  String owner();

  long fence();

  int permits();

  boolean extend(Duration lease);

  /** Releases the permits; idempotent. */
  void release();

  @Override
  default void close() {
    release();
  }
}
