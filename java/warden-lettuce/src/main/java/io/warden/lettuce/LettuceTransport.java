package io.warden.lettuce;

import io.lettuce.core.ClientOptions;
import io.lettuce.core.RedisChannelHandler;
import io.lettuce.core.RedisChannelWriter;
import io.lettuce.core.RedisClient;
import io.lettuce.core.RedisCommandExecutionException;
import io.lettuce.core.RedisConnectionStateListener;
import io.lettuce.core.RedisURI;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import io.lettuce.core.codec.StringCodec;
import io.lettuce.core.protocol.CommandArgs;
import io.lettuce.core.protocol.CommandHandler;
import io.lettuce.core.protocol.ProtocolKeyword;
import io.lettuce.core.protocol.ProtocolVersion;
import io.lettuce.core.sentinel.api.StatefulRedisSentinelConnection;
import io.netty.buffer.ByteBuf;
import io.netty.channel.Channel;
import io.netty.channel.ChannelHandlerContext;
import io.netty.channel.ChannelInboundHandlerAdapter;
import io.netty.channel.nio.AbstractNioChannel;
import io.netty.util.Timeout;
import io.warden.TrackingConnection;
import io.warden.Transport;
import io.warden.WaitConnection;
import io.warden.WardenException;
import io.warden.WardenServerException;
import io.warden.spi.WaitPool;
import java.io.IOException;
import java.io.InputStream;
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.net.InetSocketAddress;
import java.net.SocketAddress;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

/**
 * warden's {@link Transport} on Lettuce. Commands that never block go on one multiplexed
 * connection; each blocking wait gets a dedicated connection from a bounded pool (default 128, 16
 * kept idle, more kept while they were used in the last second), whose reply timeout is the {@code
 * WAIT} plus a margin. Connections open without blocking a thread ({@code connectAsync}).
 *
 * <p>Every connection the transport sends on is at-most-once: Lettuce's default reconnect sends a
 * command that was in flight when its connection dropped a second time, and a second {@code
 * LOCK.ACQUIRE} or {@code SEM.ACQUIRE} would be a second hold. The transport's connections come
 * from a {@link RedisClient} of its own (the application's resources and options, without
 * reconnect); a command whose connection drops fails, and the next command opens a new one. An
 * application connection given to {@link #create(RedisClient, StatefulRedisConnection)} is used
 * only where it does not reconnect by itself.
 *
 * <p>Through Sentinel (a {@link RedisURI} with sentinels and a master id) the transport asks
 * Sentinel for the master every second and at each near cache's {@code sync()}: when it moved, the
 * transport's shared connection and the near caches' tracking connections are closed (the next ones
 * open to the new master). A failed-over master keeps its connections until Sentinel demotes it,
 * seconds later; writes made on the new one reach none of them. Waiter connections already open,
 * and an application connection given to {@link #create(RedisClient, StatefulRedisConnection)},
 * stay until the old master closes them.
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

  /** A wait without end: Lettuce's own command timeout must not end it. */
  private static final Duration NO_TIMEOUT = Duration.ofDays(365L * 100);

  /** Waiter connections opened when the transport is created: the first waits find one ready. */
  private static final int PREWARM = 2;

  private final RedisClient own;
  private final RedisURI uri;
  // The connection for commands that never block: the application's (at-most-once) or one of
  // the transport's own, opened anew once it is closed.
  private final StatefulRedisConnection<byte[], byte[]> given;
  private final AtomicReference<CompletableFuture<StatefulRedisConnection<byte[], byte[]>>> shared =
      new AtomicReference<>();
  private final Pool pool;
  // Set by close(): no connection is opened after it (a connect on a client being shut down may
  // never answer), so every command after it fails at once.
  private volatile boolean closed;
  // Connections being closed: the client is shut down once they are (closing one twice logs).
  private final Set<CompletableFuture<Void>> closing = ConcurrentHashMap.newKeySet();
  // Near caches' tracking connections (RESP3, never reconnected), by connection; their client is
  // opened with the first.
  private final Map<Object, Tracking> tracking = new ConcurrentHashMap<>();
  private volatile RedisClient trackingClient;
  // Through Sentinel: the master's name, the address Sentinel named last, how many times it
  // changed, a connection to ask on and the check every second; all null without Sentinel.
  private final String masterId;
  private volatile String master;
  private final AtomicLong masterMoves = new AtomicLong();
  private final AtomicReference<CompletableFuture<StatefulRedisSentinelConnection<String, String>>>
      sentinel = new AtomicReference<>();
  private volatile Future<?> watch;

  private LettuceTransport(
      RedisClient client,
      RedisURI uri,
      StatefulRedisConnection<byte[], byte[]> given,
      int maxWaiters,
      int maxIdleWaiters) {
    this.uri = uri != null ? uri : uriOf(client);
    this.own = RedisClient.create(client.getResources(), this.uri);
    own.setOptions(
        client
            .getOptions()
            .mutate()
            .autoReconnect(false)
            .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
            .build());
    this.given = given != null && !given.getOptions().isAutoReconnect() ? given : null;
    this.pool = new Pool(maxWaiters, maxIdleWaiters);
    this.masterId = this.uri.getSentinels().isEmpty() ? null : this.uri.getSentinelMasterId();
    if (masterId != null) {
      try {
        // The master Sentinel names before any connection opens: a move after it closes them.
        checkMaster().get(this.uri.getTimeout().toMillis(), TimeUnit.MILLISECONDS);
      } catch (InterruptedException | ExecutionException | TimeoutException e) {
        if (e instanceof InterruptedException) {
          Thread.currentThread().interrupt();
        }
        own.shutdownAsync(0, 1, TimeUnit.SECONDS);
        Throwable cause = e.getCause() != null ? map(e.getCause()) : e;
        throw new WardenException(
            "Sentinel names no master " + masterId + ": " + cause.getMessage(), cause);
      }
      watch =
          own.getResources()
              .eventExecutorGroup()
              .scheduleWithFixedDelay(
                  () -> {
                    try {
                      checkMaster();
                    } catch (RuntimeException e) {
                      // the client is shutting down: the next check, if any, asks again
                    }
                  },
                  1,
                  1,
                  TimeUnit.SECONDS);
    }
    if (this.given == null) {
      try {
        // Opened now, as Lettuce's connect does: an unreachable server fails here.
        shared.set(CompletableFuture.completedFuture(own.connect(ByteArrayCodec.INSTANCE)));
      } catch (RuntimeException e) {
        own.shutdownAsync(0, 1, TimeUnit.SECONDS);
        throw e;
      }
    }
    pool.prewarm(Math.min(PREWARM, Math.min(maxIdleWaiters, maxWaiters)));
  }

  /** A transport on {@code client}'s default {@link RedisURI}, with its resources and options. */
  public static LettuceTransport create(RedisClient client) {
    return new LettuceTransport(client, null, null, 128, 16);
  }

  /** A transport to {@code uri} with {@code client}'s resources and options. */
  public static LettuceTransport create(RedisClient client, RedisURI uri) {
    return new LettuceTransport(client, uri, null, 128, 16);
  }

  /**
   * A transport beside the application's connection ({@code shared}, left open by {@link
   * #close()}): commands that never block go on it when it is at-most-once ({@code
   * autoReconnect(false)}), else on a connection of the transport's own; waiter connections are
   * opened to {@code client}'s default {@link RedisURI}.
   */
  public static LettuceTransport create(
      RedisClient client, StatefulRedisConnection<byte[], byte[]> shared) {
    return new LettuceTransport(client, null, shared, 128, 16);
  }

  /**
   * As {@link #create(RedisClient)} with the waiter pool's bounds: {@code maxWaiters} connections
   * at most (waits beyond wait for one, within their deadline), {@code maxIdleWaiters} kept open.
   */
  public static LettuceTransport create(RedisClient client, int maxWaiters, int maxIdleWaiters) {
    return new LettuceTransport(client, null, null, maxWaiters, maxIdleWaiters);
  }

  /**
   * The {@link RedisURI} a client was created with: Lettuce keeps it in a private field ({@code
   * RedisClient.create(uri)}), and a connection of the transport's own needs it.
   */
  private static RedisURI uriOf(RedisClient client) {
    RedisURI uri = null;
    try {
      Field f = RedisClient.class.getDeclaredField("redisURI");
      f.setAccessible(true);
      uri = (RedisURI) f.get(client);
    } catch (ReflectiveOperationException | RuntimeException e) {
      // below
    }
    if (uri == null
        || uri.getHost() == null && uri.getSocket() == null && uri.getSentinels().isEmpty()) {
      throw new IllegalArgumentException(
          "the RedisClient has no RedisURI of its own: use LettuceTransport.create(client, uri)");
    }
    return uri;
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
    // A command cancelled by its connection's close has no message: name what happened.
    return new WardenException(e.getMessage() != null ? e.getMessage() : e.toString(), e);
  }

  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    if (closed) {
      CompletableFuture<Object> f = new CompletableFuture<>();
      f.completeExceptionally(new WardenException("the transport is closed"));
      return f;
    }
    if (given != null) {
      return dispatch(given, args);
    }
    CompletableFuture<StatefulRedisConnection<byte[], byte[]>> f = shared.get();
    StatefulRedisConnection<byte[], byte[]> c = openNow(f);
    if (c != null) {
      return dispatch(c, args);
    }
    if (f == null || f.isDone()) {
      // Closed (never reconnected, so nothing is sent twice): a new connection for what follows.
      long moves = masterMoves.get();
      CompletableFuture<StatefulRedisConnection<byte[], byte[]>> next =
          own.connectAsync(ByteArrayCodec.INSTANCE, uri)
              .toCompletableFuture()
              .thenApply(conn -> sameMaster(conn, moves));
      if (!shared.compareAndSet(f, next)) {
        next.thenAccept(StatefulRedisConnection::closeAsync);
        return execute(args);
      }
      f = next;
    }
    CompletableFuture<Object> out = new CompletableFuture<>();
    f.whenComplete(
        (conn, e) -> {
          if (e != null) {
            out.completeExceptionally(map(e));
          } else {
            dispatch(conn, args).whenComplete((r, e2) -> complete(out, r, e2));
          }
        });
    return out;
  }

  /**
   * {@code conn}, opened since the master had moved {@code moves} times; closed (and a failure) if
   * it moved since: Sentinel may have named the old master to it.
   */
  private StatefulRedisConnection<byte[], byte[]> sameMaster(
      StatefulRedisConnection<byte[], byte[]> conn, long moves) {
    if (masterMoves.get() != moves) {
      conn.closeAsync();
      throw new WardenException("the master moved while connecting");
    }
    return conn;
  }

  /**
   * Through Sentinel: asks it for the master and, when it moved, closes the shared connection and
   * every tracking connection (their near caches drop what they hold before this completes).
   * Completes at once without Sentinel.
   */
  CompletableFuture<Void> checkMaster() {
    if (masterId == null || closed) {
      return CompletableFuture.completedFuture(null);
    }
    CompletableFuture<StatefulRedisSentinelConnection<String, String>> f = sentinel.get();
    if (f == null || f.isCompletedExceptionally() || f.isDone() && !f.getNow(null).isOpen()) {
      CompletableFuture<StatefulRedisSentinelConnection<String, String>> next =
          own.connectSentinelAsync(StringCodec.UTF8, uri);
      if (!sentinel.compareAndSet(f, next)) {
        next.thenAccept(StatefulRedisSentinelConnection::closeAsync);
        return checkMaster();
      }
      if (f != null) {
        f.thenAccept(StatefulRedisSentinelConnection::closeAsync);
      }
      f = next;
    }
    CompletableFuture<StatefulRedisSentinelConnection<String, String>> asked = f;
    return f.thenCompose(c -> c.async().getMasterAddrByName(masterId).toCompletableFuture())
        .thenAccept(this::named)
        .whenComplete(
            (r, e) -> {
              if (e != null && sentinel.compareAndSet(asked, null)) {
                // Asked anew on the next connection (the next sentinel of the URI if this one is
                // gone).
                asked.thenAccept(StatefulRedisSentinelConnection::closeAsync);
              }
            });
  }

  /** Sentinel named {@code addr} as the master. */
  private synchronized void named(SocketAddress addr) {
    if (addr == null) {
      throw new WardenException("Sentinel names no master " + masterId);
    }
    String now =
        addr instanceof InetSocketAddress
            ? ((InetSocketAddress) addr).getHostString()
                + ":"
                + ((InetSocketAddress) addr).getPort()
            : addr.toString();
    String before = master;
    master = now;
    if (before == null || before.equals(now)) {
      return;
    }
    // Counted first: a connection opened before it and not yet in place below closes itself.
    masterMoves.incrementAndGet();
    CompletableFuture<StatefulRedisConnection<byte[], byte[]>> f = shared.getAndSet(null);
    if (f != null) {
      f.thenAccept(
          c -> {
            CompletableFuture<Void> closed = c.closeAsync();
            closing.add(closed);
            closed.whenComplete((r, e) -> closing.remove(closed));
          });
    }
    WardenException moved = new WardenException("Sentinel names another master: " + now);
    for (Tracking t : tracking.values()) {
      t.drop(moved);
    }
  }

  private static StatefulRedisConnection<byte[], byte[]> openNow(
      CompletableFuture<StatefulRedisConnection<byte[], byte[]>> f) {
    if (f == null || !f.isDone() || f.isCompletedExceptionally()) {
      return null;
    }
    StatefulRedisConnection<byte[], byte[]> c = f.getNow(null);
    return c != null && c.isOpen() ? c : null;
  }

  private static void complete(CompletableFuture<Object> out, Object r, Throwable e) {
    if (e == null) {
      out.complete(r);
    } else {
      out.completeExceptionally(e);
    }
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
    closed = true;
    Future<?> w = watch;
    if (w != null) {
      w.cancel(false);
    }
    CompletableFuture<StatefulRedisSentinelConnection<String, String>> sc =
        sentinel.getAndSet(null);
    if (sc != null) {
      sc.thenAccept(StatefulRedisSentinelConnection::closeAsync);
    }
    pool.close();
    for (Tracking t : tracking.values()) {
      t.close();
    }
    RedisClient tc = trackingClient;
    if (tc != null) {
      tc.shutdownAsync(0, 2, TimeUnit.SECONDS);
    }
    CompletableFuture<StatefulRedisConnection<byte[], byte[]>> f = shared.getAndSet(null);
    CompletableFuture<?> sharedClosed =
        f == null
            ? CompletableFuture.completedFuture(null)
            : f.thenCompose(StatefulRedisConnection::closeAsync);
    CompletableFuture.allOf(closing.toArray(new CompletableFuture<?>[0]))
        .thenCombine(sharedClosed, (a, b) -> null)
        // The resources are the application's: shutting this client down leaves them running.
        .whenComplete((r, e) -> own.shutdownAsync(0, 2, TimeUnit.SECONDS));
  }

  /**
   * A RESP3 connection of its own with {@code CLIENT TRACKING on}, to the transport's {@link
   * RedisURI} (a Sentinel URI: the current master; closed when Sentinel names another). Lettuce
   * calls push listeners on its I/O thread as it decodes each push, before it completes any reply
   * decoded after it: the order the near cache needs. The connection is never reconnected: a drop
   * is told to the listener.
   */
  @Override
  public CompletionStage<TrackingConnection> trackingConnection(
      TrackingConnection.Listener listener) {
    CompletableFuture<TrackingConnection> f = new CompletableFuture<>();
    if (closed) {
      f.completeExceptionally(new WardenException("the transport is closed"));
      return f;
    }
    RedisClient tc = trackingClient();
    long moves = masterMoves.get();
    tc.connectAsync(ByteArrayCodec.INSTANCE, uri)
        .whenComplete(
            (c, e) -> {
              if (e != null) {
                f.completeExceptionally(map(e));
                return;
              }
              Tracking t = new Tracking(c, listener);
              tracking.put(c, t);
              t.unapplied = Unapplied.install(c);
              c.addListener(
                  push -> {
                    if ("invalidate".equals(push.getType())) {
                      List<Object> content = push.getContent(LettuceTransport::bytes);
                      listener.invalidated(keys(content.size() > 1 ? content.get(1) : null));
                    }
                  });
              if (!c.isOpen()) {
                t.drop(new WardenException("the tracking connection closed"));
              }
              if (masterMoves.get() != moves) {
                // Sentinel may have named the old master to it.
                t.drop(new WardenException("the master moved while connecting"));
              }
              dispatch(c, args("CLIENT", "TRACKING", "on"))
                  .thenCompose(ok -> dispatch(c, args("CLIENT", "ID")))
                  .whenComplete(
                      (id, e2) -> {
                        if (e2 != null) {
                          t.close();
                          f.completeExceptionally(e2);
                          return;
                        }
                        t.id = id instanceof Long ? (Long) id : -1;
                        f.complete(t);
                      });
            });
    return f;
  }

  private static Object bytes(java.nio.ByteBuffer b) {
    byte[] out = new byte[b.remaining()];
    b.duplicate().get(out);
    return out;
  }

  private static List<byte[]> keys(Object keys) {
    if (!(keys instanceof List)) {
      return null;
    }
    List<byte[]> out = new ArrayList<>();
    for (Object k : (List<?>) keys) {
      out.add(
          k instanceof byte[] ? (byte[]) k : String.valueOf(k).getBytes(StandardCharsets.UTF_8));
    }
    return out;
  }

  private static byte[][] args(String... parts) {
    byte[][] out = new byte[parts.length][];
    for (int i = 0; i < parts.length; i++) {
      out[i] = parts[i].getBytes(StandardCharsets.UTF_8);
    }
    return out;
  }

  private synchronized RedisClient trackingClient() {
    RedisClient tc = trackingClient;
    if (tc == null) {
      tc = RedisClient.create(own.getResources(), uri);
      tc.setOptions(
          own.getOptions()
              .mutate()
              .protocolVersion(ProtocolVersion.RESP3)
              .autoReconnect(false)
              .disconnectedBehavior(ClientOptions.DisconnectedBehavior.REJECT_COMMANDS)
              .build());
      tc.addListener(
          new RedisConnectionStateListener() {
            @Override
            public void onRedisDisconnected(RedisChannelHandler<?, ?> connection) {
              Tracking t = tracking.get(connection);
              if (t != null) {
                t.drop(new WardenException("the tracking connection closed"));
              }
            }

            @Override
            public void onRedisExceptionCaught(RedisChannelHandler<?, ?> connection, Throwable e) {
              Tracking t = tracking.get(connection);
              if (t != null) {
                t.drop(e);
              }
            }
          });
      trackingClient = tc;
    }
    return tc;
  }

  /**
   * What a tracking connection's channel has delivered and not applied. First in the channel's
   * pipeline, it marks bytes in hand when Netty hands it what a socket read returned, passes them
   * on to Lettuce's decoder (which tells each push to the listeners and completes each reply as it
   * decodes it, in the same call) and clears the mark once the decoder holds no partial frame. With
   * Netty's NIO transport (Lettuce's default without a native one) it also reads the socket's
   * unread bytes ({@code FIONREAD}, through the channel's socket adaptor on JDK 13 or newer).
   *
   * <p>What it cannot see: bytes a read has taken from the kernel in the instants before Netty
   * hands them here (the event loop descheduled right there); with a native transport (epoll,
   * kqueue, io_uring) or a Unix socket, bytes still in the kernel (only the mark is read: a hit can
   * be served while the event loop has yet to read an invalidation); under TLS, a partial TLS
   * record Netty's {@code SslHandler} holds.
   */
  static final class Unapplied extends ChannelInboundHandlerAdapter {
    private final Channel channel;
    private final InputStream socket;
    private final Object decoder;
    private final Field decoderBuffer;
    private volatile boolean inHand;

    private Unapplied(Channel channel, InputStream socket, Object decoder, Field decoderBuffer) {
      this.channel = channel;
      this.socket = socket;
      this.decoder = decoder;
      this.decoderBuffer = decoderBuffer;
    }

    /**
     * Put first in {@code c}'s pipeline; null if its channel cannot be found (never
     * settled-checked).
     */
    static Unapplied install(StatefulRedisConnection<?, ?> c) {
      Channel ch =
          c instanceof RedisChannelHandler
              ? channel(((RedisChannelHandler<?, ?>) c).getChannelWriter(), 0)
              : null;
      if (ch == null) {
        return null;
      }
      Object decoder = ch.pipeline().get(CommandHandler.class);
      Field buffer = null;
      try {
        buffer = CommandHandler.class.getDeclaredField("readBuffer");
        buffer.setAccessible(true);
      } catch (ReflectiveOperationException | RuntimeException e) {
        buffer = null;
      }
      Unapplied u = new Unapplied(ch, socketStream(ch), decoder, buffer);
      ch.pipeline().addFirst("warden-unapplied", u);
      return u;
    }

    /** The channel under a connection's writer (wrapped or not), found by field type. */
    private static Channel channel(Object writer, int depth) {
      if (writer == null || depth > 4) {
        return null;
      }
      for (Class<?> k = writer.getClass(); k != null && k != Object.class; k = k.getSuperclass()) {
        for (Field f : k.getDeclaredFields()) {
          if (java.lang.reflect.Modifier.isStatic(f.getModifiers())) {
            continue;
          }
          boolean isChannel = Channel.class.isAssignableFrom(f.getType());
          if (!isChannel && !RedisChannelWriter.class.isAssignableFrom(f.getType())) {
            continue;
          }
          try {
            f.setAccessible(true);
            Object v = f.get(writer);
            Channel ch = isChannel ? (Channel) v : channel(v, depth + 1);
            if (ch != null) {
              return ch;
            }
          } catch (ReflectiveOperationException | RuntimeException e) {
            // not this one
          }
        }
      }
      return null;
    }

    /** The socket's own stream, whose {@code available()} is its unread bytes; null if none. */
    private static InputStream socketStream(Channel ch) {
      if (!(ch instanceof AbstractNioChannel)) {
        return null;
      }
      try {
        Method m = AbstractNioChannel.class.getDeclaredMethod("javaChannel");
        m.setAccessible(true);
        Object sc = m.invoke(ch);
        if (!(sc instanceof SocketChannel)) {
          return null;
        }
        InputStream in = ((SocketChannel) sc).socket().getInputStream();
        // Before JDK 13 the adaptor's stream is a ChannelInputStream, which says 0 whatever
        // waits: it would tell nothing.
        for (Class<?> k = in.getClass(); k != null; k = k.getSuperclass()) {
          if (k.getName().equals("sun.nio.ch.ChannelInputStream")) {
            return null;
          }
        }
        return in;
      } catch (ReflectiveOperationException | IOException | RuntimeException e) {
        return null;
      }
    }

    @Override
    public void channelRead(ChannelHandlerContext ctx, Object msg) {
      inHand = true;
      try {
        ctx.fireChannelRead(msg);
      } finally {
        inHand = decoding();
      }
    }

    /**
     * The decoder completed a reply (on the event loop, before whoever waits for it is told): the
     * mark goes if nothing after it is left to decode.
     */
    void replied() {
      if (channel.eventLoop().inEventLoop() && !decoding()) {
        inHand = false;
      }
    }

    /** Whether the decoder holds part of a frame (read on the event loop). */
    private boolean decoding() {
      if (decoder == null || decoderBuffer == null) {
        return false;
      }
      try {
        Object b = decoderBuffer.get(decoder);
        return b instanceof ByteBuf && ((ByteBuf) b).isReadable();
      } catch (ReflectiveOperationException | RuntimeException e) {
        return false;
      }
    }

    /**
     * Nothing unread in the socket, then nothing in hand: in this order, so that bytes a read takes
     * between the two are seen by one of them (but for the instants before the mark is set).
     */
    boolean settled() {
      if (socket != null) {
        try {
          if (socket.available() > 0) {
            return false;
          }
        } catch (IOException closed) {
          return false;
        }
      }
      return !inHand;
    }
  }

  private final class Tracking implements TrackingConnection {
    private final StatefulRedisConnection<byte[], byte[]> conn;
    private final TrackingConnection.Listener listener;
    private final AtomicBoolean dropped = new AtomicBoolean();
    volatile long id = -1;
    volatile Unapplied unapplied;

    Tracking(StatefulRedisConnection<byte[], byte[]> conn, TrackingConnection.Listener listener) {
      this.conn = conn;
      this.listener = listener;
    }

    void drop(Throwable cause) {
      if (dropped.compareAndSet(false, true)) {
        tracking.remove(conn);
        conn.closeAsync();
        listener.dropped(cause);
      }
    }

    @Override
    public long clientId() {
      return id;
    }

    /** No hit while a delivered invalidation is unapplied: see {@link Unapplied}. */
    @Override
    public boolean settled() {
      Unapplied u = unapplied;
      return u == null || u.settled();
    }

    @Override
    public CompletionStage<Object> execute(byte[]... args) {
      CompletableFuture<Object> out = new CompletableFuture<>();
      dispatch(conn, args)
          .whenComplete(
              (r, e) -> {
                Unapplied u = unapplied;
                if (e == null && u != null) {
                  // A reply applies no invalidation: whoever waits for it may hit at once.
                  u.replied();
                }
                if (e == null) {
                  out.complete(r);
                } else {
                  out.completeExceptionally(e);
                }
              });
      return out;
    }

    @Override
    public CompletionStage<Void> checkMaster() {
      return LettuceTransport.this.checkMaster();
    }

    @Override
    public void close() {
      drop(new WardenException("the tracking connection was closed"));
    }
  }

  private final class Pool extends WaitPool {
    Pool(int maxSize, int maxIdle) {
      super(maxSize, maxIdle);
    }

    @Override
    protected CompletionStage<Waiter> open() {
      CompletableFuture<Waiter> f = new CompletableFuture<>();
      own.connectAsync(ByteArrayCodec.INSTANCE, uri)
          .whenComplete(
              (c, e) -> {
                if (e != null) {
                  f.completeExceptionally(map(e));
                  return;
                }
                dispatch(
                        c,
                        "CLIENT".getBytes(StandardCharsets.UTF_8),
                        "ID".getBytes(StandardCharsets.UTF_8))
                    .whenComplete(
                        (r, e2) -> {
                          if (e2 != null && !(e2 instanceof WardenServerException)) {
                            c.closeAsync();
                            f.completeExceptionally(e2);
                            return;
                          }
                          // A server that refuses CLIENT still lets the request wait: an abort
                          // withdraws it (WARDEN.WITHDRAW) or closes the connection then.
                          f.complete(new Waiter(c, r instanceof Long ? (Long) r : -1));
                        });
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
        // No reply long after the server's WAIT: the connection is lost; close it. On Lettuce's
        // wheel timer, as its own command timeouts: setting and cancelling it wakes no thread (a
        // task scheduled on an event executor woke one per wait, and again to cancel it).
        Timeout t =
            own.getResources()
                .timer()
                .newTimeout(x -> close(), replyTimeoutMillis, TimeUnit.MILLISECONDS);
        reply.whenComplete((r, e) -> t.cancel());
      }
      return reply;
    }

    @Override
    protected boolean isBroken() {
      return !conn.isOpen();
    }

    @Override
    protected void closeConnection() {
      CompletableFuture<Void> closed = conn.closeAsync();
      closing.add(closed);
      closed.whenComplete((r, e) -> closing.remove(closed));
    }
  }
}
