package io.warden;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Objects;
import java.util.concurrent.Callable;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;

/**
 * A {@link WardenCache} that keeps values in this process's memory and serves a hit with no round
 * trip; the server tells it when to drop one ({@code CLIENT TRACKING} on a dedicated RESP3
 * connection, {@link Transport#trackingConnection}). A miss reads {@code CACHE.PEEK} on that
 * connection and keeps a fresh value; a missing or stale value goes through {@code CACHE.GET ...
 * WAIT} as {@link Warden#cache()} does (one load per miss) and is not kept. Everything held is
 * dropped when the connection drops, reconnects or fails, and on a server flush; while it is down,
 * reads go to the server and it reconnects in the background.
 *
 * <pre>{@code
 * try (NearCache near = NearCache.builder(warden).maxEntries(10_000).build()) {
 *   String v = near.getOrLoadString("product:42", Duration.ofMinutes(5), () -> load(42));
 * }
 * }</pre>
 */
public final class NearCache implements WardenCache, AutoCloseable {
  /** Builds a {@link NearCache}: {@code NearCache.builder(warden).maxBytes(...).build()}. */
  public static final class Builder {
    private final Warden warden;
    private int maxEntries = 10_000;
    private long maxBytes = 64L << 20;

    Builder(Warden warden) {
      this.warden = Objects.requireNonNull(warden, "warden");
    }

    /** At most this many values held (default 10,000); least recently used go first. */
    public Builder maxEntries(int maxEntries) {
      this.maxEntries = maxEntries;
      return this;
    }

    /** At most this many bytes of values held (default 64 MiB); least recently used go first. */
    public Builder maxBytes(long maxBytes) {
      this.maxBytes = maxBytes;
      return this;
    }

    /** The near cache; its tracking connection opens in the background. */
    public NearCache build() {
      return new NearCache(this);
    }
  }

  /** What the near cache did, for tests and benchmarks. */
  public static final class Stats {
    private final long[] c;

    Stats(long[] counts) {
      this.c = counts;
    }

    /** Values held now. */
    public long entries() {
      return c[0];
    }

    /** Bytes of values held now. */
    public long bytes() {
      return c[1];
    }

    /** Reads served from memory. */
    public long hits() {
      return c[2];
    }

    /** Reads not served from memory. */
    public long misses() {
      return c[3];
    }

    /** Keys the server invalidated. */
    public long invalidations() {
      return c[4];
    }

    /** Times everything was dropped (connection up or down, a server flush). */
    public long flushes() {
      return c[5];
    }

    @Override
    public String toString() {
      return "hits="
          + hits()
          + " misses="
          + misses()
          + " invalidations="
          + invalidations()
          + " flushes="
          + flushes()
          + " entries="
          + entries()
          + " bytes="
          + bytes();
    }
  }

  /** One tracking connection, from its opening to its drop. */
  private final class Link implements TrackingConnection.Listener {
    private final AtomicBoolean dropped = new AtomicBoolean();
    volatile TrackingConnection conn;

    @Override
    public void invalidated(List<byte[]> keys) {
      if (keys == null) {
        store.flush();
        return;
      }
      for (byte[] k : keys) {
        store.invalidate(new String(k, StandardCharsets.UTF_8), true);
      }
    }

    @Override
    public void dropped(Throwable cause) {
      drop(this);
    }
  }

  private static final byte[] PEEK = Resp.b("CACHE.PEEK");
  private static final long MAX_BACKOFF_MS = 1000;

  private final Warden warden;
  private final Cache server;
  private final NearStore store;
  private final AtomicReference<Link> live = new AtomicReference<>();
  private volatile boolean closed;
  private volatile long backoffMs = 10;

  private NearCache(Builder b) {
    this.warden = b.warden;
    this.server = (Cache) b.warden.cache();
    this.store = new NearStore(b.maxEntries, b.maxBytes);
    connect();
  }

  /** A builder on {@code warden}'s transport and cache lease. */
  public static Builder builder(Warden warden) {
    return new Builder(warden);
  }

  private void connect() {
    if (closed) {
      return;
    }
    Link link = new Link();
    warden
        .transport()
        .trackingConnection(link)
        .whenComplete(
            (conn, e) -> {
              if (e != null) {
                // A transport that opens no tracking connection never will: reads go to the server.
                if (!(Resp.unwrap(e) instanceof UnsupportedOperationException)) {
                  retry();
                }
                return;
              }
              link.conn = conn;
              if (closed || link.dropped.get()) {
                conn.close();
                retry();
                return;
              }
              // Whatever was held before this connection, it never heard of: drop it all
              // before any read can use the connection.
              store.flush();
              backoffMs = 10;
              live.set(link);
              if (link.dropped.get() && live.compareAndSet(link, null)) {
                retry();
              }
            });
  }

  private void retry() {
    if (closed) {
      return;
    }
    long delay = backoffMs;
    backoffMs = Math.min(MAX_BACKOFF_MS, delay * 2);
    try {
      warden.scheduler().schedule(this::connect, delay, TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException shutDown) {
      // the Warden is closed: so is this
    }
  }

  /** The link dropped (or failed a read): everything goes, once per link. */
  private void drop(Link link) {
    if (!link.dropped.compareAndSet(false, true)) {
      return;
    }
    store.flush();
    TrackingConnection c = link.conn;
    if (c != null) {
      c.close();
    }
    if (live.compareAndSet(link, null)) {
      retry();
    }
  }

  /** The reply on {@code link}, or null after dropping it (its connection failed or hung). */
  private Object call(Link link, byte[]... args) {
    try {
      return link.conn
          .execute(args)
          .toCompletableFuture()
          .get(warden.readMarginMillis(), TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new WardenException("interrupted", e);
    } catch (TimeoutException | RuntimeException e) {
      drop(link);
      return null;
    } catch (java.util.concurrent.ExecutionException e) {
      Throwable cause = Resp.unwrap(e);
      if (cause instanceof WardenServerException) {
        throw (WardenServerException) cause;
      }
      drop(link);
      return null;
    }
  }

  /**
   * What a read of {@code key} found here: a held or freshly kept value ({@code FRESH}), a value
   * that was not kept ({@code STALE}), no value ({@code NONE}), or no answer ({@code DOWN}: the
   * tracking connection is down).
   */
  private enum Found {
    FRESH,
    STALE,
    NONE,
    DOWN
  }

  private static final class Read {
    Found found;
    byte[] value;

    Read(Found found, byte[] value) {
      this.found = found;
      this.value = value;
    }
  }

  /** Whether {@code key} has no lone surrogate, so that UTF-8 and back give the same string. */
  static boolean wellFormed(String key) {
    for (int i = 0; i < key.length(); i++) {
      char c = key.charAt(i);
      if (Character.isHighSurrogate(c)) {
        if (i + 1 >= key.length() || !Character.isLowSurrogate(key.charAt(i + 1))) {
          return false;
        }
        i++;
      } else if (Character.isLowSurrogate(c)) {
        return false;
      }
    }
    return true;
  }

  private static final Read DOWN = new Read(Found.DOWN, null);
  private static final Read NONE = new Read(Found.NONE, null);

  private Read read(String key) {
    Link link = live.get();
    // No hit while a delivered invalidation is unapplied: the tracking connection is asked first,
    // then the entry looked up. Bytes in hand or unread make this read a miss (its peek is
    // answered after them, and the generations refuse a value they overtook); it never waits.
    byte[] held =
        link == null || link.conn.settled()
            ? store.get(key, System.currentTimeMillis())
            : store.unsettled();
    if (held != null) {
      return new Read(Found.FRESH, held);
    }
    // A key with a lone surrogate goes out as '?' (UTF-8 has no other way):
    // its invalidation would name another string, so it is never kept.
    if (link == null || !wellFormed(key)) {
      return DOWN;
    }
    long generation = store.begin(key);
    Object reply = null;
    try {
      reply = call(link, PEEK, Resp.b(key));
    } catch (WardenServerException refused) {
      // WRONGTYPE, or a module without CACHE.PEEK: the server's path says what it says.
      return DOWN;
    } finally {
      if (reply == null) {
        store.end(key, generation, null, -1, 0);
      }
    }
    if (reply == null) {
      return link.dropped.get() ? DOWN : NONE;
    }
    List<Object> peek = Resp.asList(reply);
    byte[] value = (byte[]) peek.get(0);
    long expiresAt = Resp.asLong(peek.get(1));
    boolean stale = Resp.asLong(peek.get(2)) != 0;
    if (stale) {
      store.end(key, generation, null, -1, 0);
      return new Read(Found.STALE, value);
    }
    store.end(key, generation, value, expiresAt, System.currentTimeMillis());
    return new Read(Found.FRESH, value);
  }

  @Override
  public byte[] getOrLoad(String key, Duration ttl, Callable<byte[]> loader) throws Exception {
    return getOrLoad(key, ttl, Cache.BYTES, loader);
  }

  @Override
  public String getOrLoadString(String key, Duration ttl, Callable<String> loader)
      throws Exception {
    return getOrLoad(key, ttl, Cache.UTF8, loader);
  }

  @Override
  public <T> T getOrLoad(String key, Duration ttl, Codec<T> codec, Callable<T> loader)
      throws Exception {
    Objects.requireNonNull(key, "key");
    Read r = read(key);
    if (r.found == Found.FRESH) {
      return codec.decode(r.value);
    }
    // Missing or stale: CACHE.GET ... WAIT as without a near cache; the next read peeks again.
    return server.getOrLoad(key, ttl, codec, loader);
  }

  /** The value held here, or the server's (a stale one too), or null; never loads. */
  @Override
  public byte[] getIfPresent(String key) {
    Objects.requireNonNull(key, "key");
    Read r = read(key);
    switch (r.found) {
      case FRESH:
      case STALE:
        return r.value;
      case NONE:
        return null;
      default:
        return server.getIfPresent(key);
    }
  }

  /** Deletes the value on the server, then here: a read after it returns never finds it here. */
  @Override
  public void invalidate(String key) {
    Objects.requireNonNull(key, "key");
    server.invalidate(key);
    store.invalidate(key, false);
  }

  /**
   * One round trip on the tracking connection: when it returns, every invalidation the server
   * queued for this near cache before it has been applied. After your write is acknowledged, a read
   * after {@code sync()} never returns the older value. Through Sentinel it first asks for the
   * master, and drops the connection when the master moved. With the connection down it returns at
   * once (nothing is held then).
   */
  public void sync() {
    Link link = live.get();
    if (link != null && reachesMaster(link)) {
      call(link, Resp.b("PING"));
    }
  }

  /**
   * Whether {@code link} still reaches the master its transport follows (Sentinel's); if not, or if
   * that cannot be asked, it is dropped. A failed-over master keeps its connections until Sentinel
   * demotes it, seconds later, and hears nothing of the writes made on the new one: no invalidation
   * of them would ever come.
   */
  private boolean reachesMaster(Link link) {
    try {
      link.conn
          .checkMaster()
          .toCompletableFuture()
          .get(warden.readMarginMillis(), TimeUnit.MILLISECONDS);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new WardenException("interrupted", e);
    } catch (TimeoutException | java.util.concurrent.ExecutionException | RuntimeException e) {
      drop(link);
    }
    return !link.dropped.get();
  }

  /** The counters and the current size. */
  public Stats stats() {
    return new Stats(store.counts());
  }

  /**
   * {@code CLIENT ID} of the tracking connection, or -1 while it is down (tests find it with it).
   */
  public long trackingClientId() {
    Link link = live.get();
    return link == null ? -1 : link.conn.clientId();
  }

  /** Closes the tracking connection and drops everything held. */
  @Override
  public void close() {
    closed = true;
    Link link = live.getAndSet(null);
    if (link != null) {
      drop(link);
    }
    store.flush();
  }
}
