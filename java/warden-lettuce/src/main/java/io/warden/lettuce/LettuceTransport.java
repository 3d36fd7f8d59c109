package io.warden.lettuce;

import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.warden.Transport;
import io.warden.WaitConnection;
import io.warden.WardenException;
import io.warden.WardenServerException;
import io.warden.spi.WaitPool;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * warden's {@link Transport} on Lettuce: commands that never block go on one shared multiplexed
 * connection; each blocking wait gets a dedicated connection from a bounded pool (default 128, 16
 * kept idle), whose reply timeout is the {@code WAIT} plus a margin. A waiter connection that drops
 * is closed, never reconnected: a blocking request is never sent twice.
 */
public final class LettuceTransport implements Transport {
  /** A command name as Lettuce sends it. */
  private static final class Keyword implements ProtocolKeyword {
    private final byte[] bytes;

    Keyword(byte[] bytes) {
      this.bytes = bytes;
    }

    @Override
    public byte[] getBytes() {
      return bytes;
    }

    @Override
    public String toString() {
      return new String(bytes, StandardCharsets.UTF_8);
    }
  }

  private static final AtomicInteger THREADS = new AtomicInteger();

  /** A wait without end: Lettuce's own command timeout must not end it. */
  private static final Duration NO_TIMEOUT = Duration.ofDays(365L * 100);

  private final RedisClient client;
  private final StatefulRedisConnection<byte[], byte[]> shared;
  private final boolean ownsShared;
  private final Pool pool;
  private final ExecutorService opener;
  private final Set<Object> waiters = ConcurrentHashMap.newKeySet();
  private final RedisConnectionStateListener dropped =
      new RedisConnectionStateListener() {
        @Override
        public void onRedisDisconnected(RedisChannelHandler<?, ?> connection) {
          // A waiter connection that drops is closed at once: Lettuce would reconnect and send
          // its blocking request again.
          if (waiters.contains(connection)) {
            connection.closeAsync();
          }
        }

        @Override
        public void onRedisConnected(RedisChannelHandler<?, ?> connection, SocketAddress a) {}

        @Override
        public void onRedisExceptionCaught(RedisChannelHandler<?, ?> connection, Throwable t) {}
      };

  private LettuceTransport(
      RedisClient client,
      StatefulRedisConnection<byte[], byte[]> shared,
      boolean ownsShared,
      int maxWaiters,
      int maxIdleWaiters) {
    this.client = client;
    this.shared = shared;
    this.ownsShared = ownsShared;
    this.opener =
        Executors.newCachedThreadPool(
            r -> {
              Thread t = new Thread(r, "warden-lettuce-connect-" + THREADS.incrementAndGet());
              t.setDaemon(true);
              return t;
            });
    this.pool = new Pool(maxWaiters, maxIdleWaiters);
    client.addListener(dropped);
  }

  /** A transport on {@code client}: it opens its shared connection and its waiter connections. */
  public static LettuceTransport create(RedisClient client) {
    return new LettuceTransport(client, client.connect(ByteArrayCodec.INSTANCE), true, 128, 16);
  }

  /**
   * A transport on the application's connection ({@code shared}, left open by {@link #close()});
   * waiter connections are opened on {@code client}.
   */
  public static LettuceTransport create(
      RedisClient client, StatefulRedisConnection<byte[], byte[]> shared) {
    return new LettuceTransport(client, shared, false, 128, 16);
  }

  /**
   * As {@link #create(RedisClient)} with the waiter pool's bounds: {@code maxWaiters} connections
   * at most (waits beyond wait for one, within their deadline), {@code maxIdleWaiters} kept open.
   */
  public static LettuceTransport create(RedisClient client, int maxWaiters, int maxIdleWaiters) {
    return new LettuceTransport(
        client, client.connect(ByteArrayCodec.INSTANCE), true, maxWaiters, maxIdleWaiters);
  }

  static CompletionStage<Object> dispatch(
      StatefulRedisConnection<byte[], byte[]> conn, byte[]... args) {
    CommandArgs<byte[], byte[]> ca = new CommandArgs<>(ByteArrayCodec.INSTANCE);
    for (int i = 1; i < args.length; i++) {
      ca.add(args[i]);
    }
    CompletableFuture<Object> out = new CompletableFuture<>();
    try {
      conn.async()
          .dispatch(new Keyword(args[0]), new ReplyOutput(), ca)
          .whenComplete(
              (r, e) -> {
                if (e == null) {
                  out.complete(r);
                } else {
                  out.completeExceptionally(map(e));
                }
              });
    } catch (RuntimeException e) {
      out.completeExceptionally(map(e));
    }
    return out;
  }

  private static Throwable map(Throwable e) {
    while (e instanceof CompletionException && e.getCause() != null) {
      e = e.getCause();
    }
    if (e instanceof RedisCommandExecutionException) {
      return new WardenServerException(e.getMessage(), e);
    }
    if (e instanceof WardenException) {
      return e;
    }
    return new WardenException(String.valueOf(e.getMessage()), e);
  }

  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    return dispatch(shared, args);
  }

  @Override
  public CompletionStage<WaitConnection> waitConnection(long deadlineNanos) {
    return pool.acquire(deadlineNanos);
  }

  /** Waiter connections open now. */
  public int waiterConnections() {
    return pool.openConnections();
  }

  @Override
  public void close() {
    pool.close();
    client.removeListener(dropped);
    if (ownsShared) {
      shared.close();
    }
    opener.shutdownNow();
  }

  private final class Pool extends WaitPool {
    Pool(int maxSize, int maxIdle) {
      super(maxSize, maxIdle);
    }

    @Override
    protected CompletionStage<Waiter> open() {
      CompletableFuture<Waiter> f = new CompletableFuture<>();
      opener.execute(
          () -> {
            try {
              StatefulRedisConnection<byte[], byte[]> c = client.connect(ByteArrayCodec.INSTANCE);
              waiters.add(c);
              long id;
              try {
                Object r =
                    dispatch(
                            c,
                            "CLIENT".getBytes(StandardCharsets.UTF_8),
                            "ID".getBytes(StandardCharsets.UTF_8))
                        .toCompletableFuture()
                        .get(30, TimeUnit.SECONDS);
                id = r instanceof Long ? (Long) r : -1;
              } catch (java.util.concurrent.ExecutionException e) {
                // A server that refuses CLIENT still lets the request wait: an abort closes it.
                id = -1;
              }
              f.complete(new Waiter(c, id));
            } catch (Exception e) {
              f.completeExceptionally(map(e));
            }
          });
      return f;
    }
  }

  private final class Waiter extends WaitPool.Pooled {
    private final StatefulRedisConnection<byte[], byte[]> conn;
    private final long id;

    Waiter(StatefulRedisConnection<byte[], byte[]> conn, long id) {
      this.conn = conn;
      this.id = id;
    }

    @Override
    public long clientId() {
      return id;
    }

    @Override
    public CompletionStage<Object> execute(long replyTimeoutMillis, byte[]... args) {
      conn.setTimeout(
          replyTimeoutMillis <= 0 ? NO_TIMEOUT : Duration.ofMillis(replyTimeoutMillis + 1000));
      CompletionStage<Object> reply = dispatch(conn, args);
      if (replyTimeoutMillis > 0) {
        // No reply long after the server's WAIT: the connection is lost; close it.
        Future<?> t =
            client
                .getResources()
                .eventExecutorGroup()
                .schedule(this::close, replyTimeoutMillis, TimeUnit.MILLISECONDS);
        reply.whenComplete((r, e) -> t.cancel(false));
      }
      return reply;
    }

    @Override
    protected void closeConnection() {
      waiters.remove(conn);
      conn.closeAsync();
    }
  }
}
