package io.warden.jedis;

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

  private static CommandArguments arguments(byte[]... args) {
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

  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    CompletableFuture<Object> f = new CompletableFuture<>();
    try {
      f.complete(normalize(shared.executeCommand(arguments(args))));
    } catch (RuntimeException e) {
      f.completeExceptionally(map(e));
    }
    return f;
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
            Connection c = null;
            try {
              c = new Connection(address, config);
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
                // A server that refuses CLIENT still lets the request wait: an abort closes it.
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

  private final class Waiter extends WaitPool.Pooled {
    private final Connection conn;
    private final long id;

    Waiter(Connection conn, long id) {
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
              conn.setSoTimeout((int) Math.min(Integer.MAX_VALUE, Math.max(0, replyTimeoutMillis)));
              f.complete(normalize(conn.executeCommand(arguments(args))));
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
      conn.disconnect();
    }
  }
}
