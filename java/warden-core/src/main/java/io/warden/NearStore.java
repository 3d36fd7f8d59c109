package io.warden;

import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.locks.ReentrantLock;

/**
 * A near cache's memory, pure (no I/O; the time is an argument): values by key in LRU order under
 * two bounds, and the generations that decide whether a read's reply may be kept.
 *
 * <p>A read calls {@link #begin} before it sends {@code CACHE.PEEK} and {@link #end} with the
 * reply: the reply is kept only if no invalidation of its key and no flush came in between, so an
 * invalidation racing a read never leaves the older value here, whichever thread inserts it.
 */
final class NearStore {
  private static final class Entry {
    final byte[] value;
    final long expiresAtMs;

    Entry(byte[] value, long expiresAtMs) {
      this.value = value;
      this.expiresAtMs = expiresAtMs;
    }
  }

  /** The reads of one key in flight, and the generation of its last invalidation. */
  private static final class Reads {
    int count;
    long invalidatedAt = -1;
  }

  private final int maxEntries;
  private final long maxBytes;
  // One short lock: a hit is a map lookup under it, and no thread waits on I/O holding it.
  private final ReentrantLock lock = new ReentrantLock();
  private final LinkedHashMap<String, Entry> entries = new LinkedHashMap<>(16, 0.75f, true);
  private final Map<String, Reads> reads = new HashMap<>();
  private long bytes;
  // Moved on by every invalidation and flush.
  private long generation;
  private long flushedAt;
  private long hits;
  private long misses;
  private long invalidations;
  private long flushes;

  NearStore(int maxEntries, long maxBytes) {
    this.maxEntries = maxEntries;
    this.maxBytes = maxBytes;
  }

  /** The value held for {@code key}, or null (a miss; an expired value is dropped). */
  byte[] get(String key, long nowMs) {
    lock.lock();
    try {
      Entry e = entries.get(key);
      if (e != null && e.expiresAtMs >= 0 && nowMs >= e.expiresAtMs) {
        remove(key);
        e = null;
      }
      if (e == null) {
        misses++;
        return null;
      }
      hits++;
      return e.value;
    } finally {
      lock.unlock();
    }
  }

  /**
   * A read that could not look here (its tracking connection had something unapplied): a miss.
   * Null, for the caller's convenience.
   */
  byte[] unsettled() {
    lock.lock();
    try {
      misses++;
      return null;
    } finally {
      lock.unlock();
    }
  }

  /** A read of {@code key} starts: its generation, for {@link #end}. */
  long begin(String key) {
    lock.lock();
    try {
      Reads r = reads.get(key);
      if (r == null) {
        r = new Reads();
        reads.put(key, r);
      }
      r.count++;
      return generation;
    } finally {
      lock.unlock();
    }
  }

  /**
   * The read of {@code key} begun at {@code generation} ends with {@code value} (null: nothing to
   * keep) expiring at {@code expiresAtMs} ({@code -1}: never): kept if nothing moved the key on
   * since, the value has not expired and it fits the bounds. Whether it was kept.
   */
  boolean end(String key, long generation, byte[] value, long expiresAtMs, long nowMs) {
    lock.lock();
    try {
      Reads r = reads.get(key);
      boolean moved = flushedAt > generation || (r != null && r.invalidatedAt > generation);
      if (r != null && --r.count == 0) {
        reads.remove(key);
      }
      if (value == null || moved || (expiresAtMs >= 0 && nowMs >= expiresAtMs)) {
        return false;
      }
      if (value.length > maxBytes || maxEntries <= 0) {
        return false;
      }
      Entry old = entries.put(key, new Entry(value, expiresAtMs));
      if (old != null) {
        bytes -= old.value.length;
      }
      bytes += value.length;
      Iterator<Map.Entry<String, Entry>> eldest = entries.entrySet().iterator();
      while (entries.size() > maxEntries || bytes > maxBytes) {
        bytes -= eldest.next().getValue().value.length;
        eldest.remove();
      }
      return true;
    } finally {
      lock.unlock();
    }
  }

  /** The server invalidated {@code key} ({@code pushed}), or this process did. */
  void invalidate(String key, boolean pushed) {
    lock.lock();
    try {
      generation++;
      if (pushed) {
        invalidations++;
      }
      remove(key);
      Reads r = reads.get(key);
      if (r != null) {
        r.invalidatedAt = generation;
      }
    } finally {
      lock.unlock();
    }
  }

  /** Everything goes: no read in flight may keep its reply. */
  void flush() {
    lock.lock();
    try {
      generation++;
      flushedAt = generation;
      flushes++;
      entries.clear();
      bytes = 0;
    } finally {
      lock.unlock();
    }
  }

  private void remove(String key) {
    Entry old = entries.remove(key);
    if (old != null) {
      bytes -= old.value.length;
    }
  }

  /** {@code [entries, bytes, hits, misses, invalidations, flushes]}, read together. */
  long[] counts() {
    lock.lock();
    try {
      return new long[] {entries.size(), bytes, hits, misses, invalidations, flushes};
    } finally {
      lock.unlock();
    }
  }
}
