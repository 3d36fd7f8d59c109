package io.warden;

import java.time.Duration;
import java.util.concurrent.Callable;

/**
 * Cache leases ({@code CACHE.*}): on a miss one caller across every process loads the value while
 * the others wait for it.
 */
public interface WardenCache {
  /**
   * The cached value, or the loader's, stored for {@code ttl}; one load per miss across processes.
   * A loader exception abandons the lease (the next waiter loads) and is thrown here; a loader that
   * returns null caches nothing (the lease is abandoned) and null is returned.
   */
  byte[] getOrLoad(String key, Duration ttl, Callable<byte[]> loader) throws Exception;

  String getOrLoadString(String key, Duration ttl, Callable<String> loader) throws Exception;

  <T> T getOrLoad(String key, Duration ttl, Codec<T> codec, Callable<T> loader) throws Exception;

  /** The cached value, or null (never loads). */
  byte[] getIfPresent(String key);

  /** Deletes the value and revokes an outstanding fill lease. */
  void invalidate(String key);
}
