package io.warden.jedis;

import io.warden.TrackingConnection;
import io.warden.Transport;
import io.warden.WaitConnection;
import io.warden.WardenException;
import io.warden.WardenServerException;
import io.warden.spi.WaitPool;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.UnifiedJedis;
import redis.clients.jedis.commands.ProtocolCommand;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.KeyValue;

/**
 * warden's {@link Transport} on Jedis, thin: commands that never block run on the application's
 * pooled client (a {@link UnifiedJedis}: Jedis 8's {@link RedisClient}, or a {@code JedisPooled});
 * each blocking wait gets a dedicated {@link Connection} from a bounded pool (default 128, 16 kept
 * idle), its socket timeout set to the {@code WAIT} plus a margin, read by a thread of its own.
 * Jedis is synchronous: the stages this transport returns for shared commands are already complete.
 */
public final class JedisTransport implements Transport {
  private static final AtomicInteger THREADS = new AtomicInteger();

  private final UnifiedJedis shared;
  private final boolean ownsShared;
  private final HostAndPort address;
  private final JedisClientConfig config;
  private final ExecutorService readers;
  private final Pool pool;
  // Near caches' tracking connections, closed with the transport.
  private final java.util.Set<JedisTracking> tracking =
      java.util.concurrent.ConcurrentHashMap.newKeySet();
  private volatile boolean closed;

  private JedisTransport(
      UnifiedJedis shared,
      boolean ownsShared,
      HostAndPort address,
      JedisClientConfig config,
      int maxWaiters,
      int maxIdleWaiters) {
    this.shared = shared;
    this.ownsShared = ownsShared;
    this.address = address;
    this.config = config;
    this.readers =
        Executors.newCachedThreadPool(
            r -> {
              Thread t = new Thread(r, "warden-jedis-wait-" + THREADS.incrementAndGet());
              t.setDaemon(true);
              return t;
            });
    this.pool = new Pool(maxWaiters, maxIdleWaiters);
  }

  /**
   * A transport on the application's client ({@code shared}, left open by {@link #close()}); waiter
   * connections go to {@code address} with {@code config}.
   */
  public static JedisTransport create(
      UnifiedJedis shared, HostAndPort address, JedisClientConfig config) {
    return new JedisTransport(shared, false, address, config, 128, 16);
  }

  /**
   * A transport on the application's {@link RedisClient}: waiter connections go to the address its
   * pool connects to, with the default client config (use {@link #create(UnifiedJedis, HostAndPort,
   * JedisClientConfig)} for a password or TLS).
   */
  public static JedisTransport create(RedisClient shared) {
    HostAndPort address;
    try (Connection c = shared.getPool().getResource()) {
      address = c.getHostAndPort();
    }
    return new JedisTransport(
        shared, false, address, DefaultJedisClientConfig.builder().build(), 128, 16);
  }

  /** A transport that opens its own pooled client to {@code address}. */
  public static JedisTransport create(HostAndPort address, JedisClientConfig config) {
    RedisClient client = RedisClient.builder().hostAndPort(address).clientConfig(config).build();
    return new JedisTransport(client, true, address, config, 128, 16);
  }

  /** A command name as Jedis sends it. */
  private static final class Command implements ProtocolCommand {
    private final byte[] raw;

    Command(byte[] raw) {
      this.raw = raw;
    }

    @Override
    public byte[] getRaw() {
      return raw;
    }

    @Override
    public boolean equals(Object o) {
      return o instanceof Command && Arrays.equals(((Command) o).raw, raw);
    }

    @Override
    public int hashCode() {
      return Arrays.hashCode(raw);
    }
  }

  static CommandArguments arguments(byte[]... args) {
    CommandArguments ca = new CommandArguments(new Command(args[0]));
    for (int i = 1; i < args.length; i++) {
      ca.add(args[i]);
    }
    return ca;
  }

  private static Throwable map(Throwable e) {
    if (e instanceof JedisDataException) {
      return new WardenServerException(e.getMessage(), e);
    }
    if (e instanceof WardenException) {
      return e;
    }
    return new WardenException(String.valueOf(e.getMessage()), e);
  }

  /**
   * Jedis' reply as the transport contract maps it: a RESP3 map (Jedis' {@link KeyValue} pairs or a
   * {@link Map}) as a flat field/value list, a boolean as 1/0.
   */
  static Object normalize(Object reply) {
    if (reply instanceof List) {
      List<Object> out = new ArrayList<>();
      for (Object e : (List<?>) reply) {
        if (e instanceof KeyValue) {
          out.add(normalize(((KeyValue<?, ?>) e).getKey()));
          out.add(normalize(((KeyValue<?, ?>) e).getValue()));
        } else {
          out.add(normalize(e));
        }
      }
      return out;
    }
    if (reply instanceof Map) {
      List<Object> out = new ArrayList<>();
      for (Map.Entry<?, ?> e : ((Map<?, ?>) reply).entrySet()) {
        out.add(normalize(e.getKey()));
        out.add(normalize(e.getValue()));
      }
      return out;
    }
    if (reply instanceof Boolean) {
      return ((Boolean) reply) ? 1L : 0L;
    }
    return reply;
  }

  /**
   * Runs on the caller's thread. An interrupt while the pool lends a connection is not a failure of
   * the command (commons-pool2 would report "Could not get a resource from the pool" and clear the
   * flag, and a release would be lost): the command, not sent yet, is run anyway and the interrupt
   * is kept for the caller's next wait.
   */
  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    CompletableFuture<Object> f = new CompletableFuture<>();
    boolean interrupted = false;
    try {
      while (true) {
        try {
          f.complete(normalize(shared.executeCommand(arguments(args))));
          break;
        } catch (RuntimeException e) {
          if (!interruptedBorrowing(e)) {
            f.completeExceptionally(map(e));
            break;
          }
          interrupted = true;
          Thread.interrupted();
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
    return f;
  }

  /** Jedis' socket I/O is not interruptible: an InterruptedException comes from the pool. */
  private static boolean interruptedBorrowing(Throwable e) {
    for (Throwable c = e; c != null; c = c.getCause()) {
      if (c instanceof InterruptedException) {
        return true;
      }
    }
    return false;
  }

  @Override
  public CompletionStage<WaitConnection> waitConnection(long deadlineNanos) {
    return pool.acquire(deadlineNanos);
  }

  /** Waiter connections open now. */
  public int waiterConnections() {
    return pool.openConnections();
  }

  /**
   * A RESP3 {@link Connection} of its own to the transport's address with {@code CLIENT TRACKING
   * on}, read by a thread of its own; opened on that thread.
   */
  @Override
  public CompletionStage<TrackingConnection> trackingConnection(
      TrackingConnection.Listener listener) {
    CompletableFuture<TrackingConnection> f = new CompletableFuture<>();
    if (closed) {
      f.completeExceptionally(new WardenException("the transport is closed"));
      return f;
    }
    try {
      readers.execute(
          () -> {
            JedisTracking t;
            try {
              t = new JedisTracking(address, config, listener);
            } catch (RuntimeException e) {
              f.completeExceptionally(map(e));
              return;
            }
            tracking.add(t);
            if (closed) {
              t.close();
            }
            f.complete(t);
            try {
              t.read();
            } finally {
              tracking.remove(t);
            }
          });
    } catch (java.util.concurrent.RejectedExecutionException e) {
      f.completeExceptionally(new WardenException("the transport is closed", e));
    }
    return f;
  }

  @Override
  public void close() {
    closed = true;
    for (JedisTracking t : tracking) {
      t.close();
    }
    pool.close();
    if (ownsShared) {
      shared.close();
    }
    readers.shutdownNow();
  }

  private final class Pool extends WaitPool {
    Pool(int maxSize, int maxIdle) {
      super(maxSize, maxIdle);
    }

    @Override
    protected CompletionStage<Waiter> open() {
      CompletableFuture<Waiter> f = new CompletableFuture<>();
      readers.execute(
          () -> {
            WaitSocket c = null;
            try {
              c = new WaitSocket(address, config);
              c.connect();
              long id;
              try {
                Object r =
                    c.executeCommand(
                        arguments(
                            "CLIENT".getBytes(StandardCharsets.UTF_8),
                            "ID".getBytes(StandardCharsets.UTF_8)));
                id = r instanceof Long ? (Long) r : -1;
              } catch (JedisDataException e) {
                // A server that refuses CLIENT still lets the request wait: an abort withdraws it
                // (WARDEN.WITHDRAW) or closes the connection.
                id = -1;
              }
              f.complete(new Waiter(c, id));
            } catch (RuntimeException e) {
              if (c != null) {
                c.disconnect();
              }
              f.completeExceptionally(map(e));
            }
          });
      return f;
    }
  }

  /**
   * A waiter's Jedis {@link Connection}, whose buffered request can be written to the socket
   * without reading a reply ({@link Connection#getOne()} does both, the write outside any lock of
   * ours).
   */
  private static final class WaitSocket extends Connection {
    WaitSocket(HostAndPort address, JedisClientConfig config) {
      super(address, config);
    }

    /** Writes the buffered request to the socket. */
    void write() {
      flush();
    }
  }

  private final class Waiter extends WaitPool.Pooled {
    private final WaitSocket conn;
    private final long id;
    // Invariant: a request is written to the socket at most once, and only on the connection the
    // wait started with. So `closed` is checked and the request both buffered and written (flushed)
    // under one lock, which a close takes before it disconnects:
    // - Jedis reconnects a closed Connection on its next send: a request buffered after an abort
    //   closed it would go out again on a new connection, where its grant is never given back;
    // - Jedis' disconnect() flushes the output buffer itself, and its RedisOutputStream is not
    //   thread-safe: a request buffered here and flushed by getOne() on this thread while an
    //   abort's close flushed it too went out twice, and the server granted the second as a
    //   re-entry by the same owner (a hold counted twice): the abort's one give-back (release by
    //   owner) left the other held for its whole lease.
    private final ReentrantLock sending = new ReentrantLock();
    private boolean closed;

    Waiter(WaitSocket conn, long id) {
      this.conn = conn;
      this.id = id;
    }

    @Override
    public long clientId() {
      return id;
    }

    @Override
    public CompletionStage<Object> execute(long replyTimeoutMillis, byte[]... args) {
      CompletableFuture<Object> f = new CompletableFuture<>();
      readers.execute(
          () -> {
            try {
              // No reply within the WAIT plus the margin: the read fails and the connection is
              // closed by the caller; the request is never sent again.
              sending.lock();
              try {
                if (closed) {
                  throw new WardenException("the waiter connection closed before the request");
                }
                conn.setSoTimeout(
                    (int) Math.min(Integer.MAX_VALUE, Math.max(0, replyTimeoutMillis)));
                conn.sendCommand(arguments(args)); // buffered
                conn.write(); // on the socket: the buffer is empty when a close takes the lock
              } finally {
                sending.unlock();
              }
              f.complete(normalize(conn.getOne())); // nothing left to flush: reads the reply
            } catch (JedisDataException e) {
              f.completeExceptionally(map(e));
            } catch (RuntimeException e) {
              conn.setBroken();
              f.completeExceptionally(map(e));
            }
          });
      return f;
    }

    @Override
    protected void closeConnection() {
      sending.lock();
      try {
        closed = true;
      } finally {
        sending.unlock();
      }
      try {
        conn.disconnect();
      } catch (RuntimeException e) {
        // The socket is closed all the same (Jedis closes it in a finally); a close never throws
        // into an abort, which still has to wait for the server and give back what it granted.
      }
    }
  }
}
