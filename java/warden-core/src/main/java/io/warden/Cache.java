package io.warden;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.Optional;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;

/**
 * {@link WardenCache} on {@code CACHE.*}: a miss takes the key's one fill lease (load, then {@code
 * CACHE.FILL}); others wait for that fill ({@code CACHE.GET ... WAIT}). A loader exception abandons
 * the lease, so the next waiter loads at once.
 */
final class Cache implements WardenCache {
  static final Codec<String> UTF8 =
      new Codec<String>() {
        @Override
        public byte[] encode(String value) {
          return value.getBytes(StandardCharsets.UTF_8);
        }

        @Override
        public String decode(byte[] bytes) {
          return new String(bytes, StandardCharsets.UTF_8);
        }
      };

  static final Codec<byte[]> BYTES =
      new Codec<byte[]>() {
        @Override
        public byte[] encode(byte[] value) {
          return value;
        }

        @Override
        public byte[] decode(byte[] bytes) {
          return bytes;
        }
      };

  private final Warden warden;
  private final long leaseMs;

  Cache(Warden warden, long leaseMs) {
    this.warden = warden;
    this.leaseMs = leaseMs;
  }

  @Override
  public byte[] getOrLoad(String key, Duration ttl, Callable<byte[]> loader) throws Exception {
    return getOrLoad(key, ttl, BYTES, loader);
  }

  @Override
  public String getOrLoadString(String key, Duration ttl, Callable<String> loader)
      throws Exception {
    return getOrLoad(key, ttl, UTF8, loader);
  }

  @Override
  public <T> T getOrLoad(String key, Duration ttl, Codec<T> codec, Callable<T> loader)
      throws Exception {
    Objects.requireNonNull(key, "key");
    while (true) {
      // Each round waits at most two leases for another caller's fill; a lease that ends
      // unfilled is handed to the oldest waiter, so a round ends with a value or a lease.
      long deadline =
          Deadline.after(System.nanoTime(), TimeUnit.MILLISECONDS.toNanos(2 * leaseMs + 1000));
      Attempt a =
          new Attempt(
              warden,
              Resp.args("CACHE.GET", key, Long.toString(leaseMs)),
              deadline,
              true,
              -1,
              kind(key));
      CompletableFuture<Optional<Object>> out = a.deliverTo(r -> r, r -> giveBack(key, r), r -> {});
      a.start();
      Optional<Object> got = a.await(out, r -> giveBack(key, r));
      if (!got.isPresent()) {
        continue;
      }
      List<Object> pair = Resp.asList(got.get());
      byte[] value = (byte[]) pair.get(0);
      Long lease = Resp.asLong(pair.get(1));
      // A lease won on a waiter connection ends if that connection closes: it stays out of the
      // pool (releaseKept) until the lease is filled or abandoned.
      if (value != null) {
        if (lease != null) {
          // A stale value: serve it, and reload it in the background under this lease.
          CompletableFuture.runAsync(
              () -> {
                try {
                  load(key, lease, ttl, codec, loader);
                } catch (Exception e) {
                  // abandoned by load; the value stays stale
                } finally {
                  a.releaseKept();
                }
              });
        }
        return codec.decode(value);
      }
      try {
        return load(key, lease, ttl, codec, loader);
      } finally {
        a.releaseKept();
      }
    }
  }

  private <T> T load(String key, long lease, Duration ttl, Codec<T> codec, Callable<T> loader)
      throws Exception {
    T v;
    byte[] bytes;
    try {
      v = loader.call();
      // Nothing to cache (as Map.computeIfAbsent): the lease is abandoned, so the next caller
      // loads; a null is never stored as some encoding of "null".
      bytes = v == null ? null : codec.encode(v);
    } catch (Exception | Error e) {
      abandon(key, lease);
      throw e;
    }
    if (bytes == null) {
      abandon(key, lease);
      return v;
    }
    if (ttl == null || ttl.isZero() || ttl.isNegative()) {
      warden.call("CACHE.FILL", key, Long.toString(lease), bytes);
    } else {
      warden.call(
          "CACHE.FILL",
          key,
          Long.toString(lease),
          bytes,
          "PX",
          Long.toString(LockRequest.ceilMillis(ttl)));
    }
    return v;
  }

  private void abandon(String key, long lease) {
    try {
      warden.call("CACHE.ABANDON", key, Long.toString(lease));
    } catch (RuntimeException e) {
      // the lease ends with its ttl anyway
    }
  }

  private Attempt.Kind kind(String key) {
    return new Attempt.Kind() {
      @Override
      public boolean granted(Object reply) {
        List<Object> pair = Resp.asList(reply);
        return pair.get(0) != null || pair.get(1) != null;
      }

      @Override
      public CompletionStage<?> giveBack(Object reply) {
        return Cache.this.giveBack(key, reply);
      }

      @Override
      public CompletionStage<?> giveBackUnseen() {
        // A fill lease ends when its holder's connection closes.
        return CompletableFuture.completedFuture(null);
      }

      @Override
      public boolean boundToConnection(Object reply) {
        return Resp.asList(reply).get(1) != null;
      }
    };
  }

  /** A fill lease nobody will use is abandoned, so the next waiter loads at once. */
  private CompletionStage<?> giveBack(String key, Object reply) {
    Long lease = Resp.asLong(Resp.asList(reply).get(1));
    if (lease == null) {
      return CompletableFuture.completedFuture(null);
    }
    return warden.transport().execute(Resp.args("CACHE.ABANDON", key, Long.toString(lease)));
  }

  @Override
  public byte[] getIfPresent(String key) {
    Object v = warden.call("GET", key);
    return v == null ? null : v instanceof byte[] ? (byte[]) v : Resp.b(Resp.str(v));
  }

  @Override
  public void invalidate(String key) {
    warden.call("CACHE.INVALIDATE", key);
  }
}
