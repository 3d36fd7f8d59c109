package io.warden.bench;

/** One library's way to take a lock, a semaphore permit or a read-write lock, opened per JVM. */
interface Contender extends AutoCloseable {
  /** A per-thread handle on one key. */
  Locker locker(String key, int thread) throws Exception;

  @Override
  void close();

  /** Takes and gives back one hold; each worker thread owns one. */
  interface Locker {
    void acquire() throws Exception;

    void release() throws Exception;
  }
}
