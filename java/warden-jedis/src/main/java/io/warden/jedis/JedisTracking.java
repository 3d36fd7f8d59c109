package io.warden.jedis;

import io.warden.TrackingConnection;
import io.warden.WardenException;
import io.warden.WardenServerException;
import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Deque;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.locks.ReentrantLock;
import redis.clients.jedis.CommandArguments;
import redis.clients.jedis.Connection;
import redis.clients.jedis.DefaultJedisClientConfig;
import redis.clients.jedis.DefaultJedisSocketFactory;
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.JedisSocketFactory;
import redis.clients.jedis.PushConsumerChain;
import redis.clients.jedis.PushMessage;
import redis.clients.jedis.RedisProtocol;
import redis.clients.jedis.exceptions.JedisConnectionException;
import redis.clients.jedis.exceptions.JedisDataException;
import redis.clients.jedis.util.RedisInputStream;

/**
 * A near cache's tracking connection on Jedis: a RESP3 {@link Connection} (its {@code HELLO 3},
 * auth and TLS from the application's config) with {@code CLIENT TRACKING on}, read by a thread of
 * its own. Jedis hands each push to the connection's push consumers as it reads it, before it
 * returns the next reply, so invalidations and replies reach the near cache in the server's order;
 * commands from any thread are written under a lock, their replies matched in order.
 *
 * <p>It is {@link #settled()} when the socket has nothing unread ({@code available()}: {@code
 * FIONREAD} on a plain TCP socket) and the reader holds no bytes it has not applied: the reader
 * reads through {@link Received}, which marks bytes in hand as soon as a socket read returns them
 * and clears the mark once every frame they began has been told to the near cache (a push) or
 * completed (a reply). What it cannot see: bytes a socket read has taken from the kernel in the
 * instants before the mark is set (the reader descheduled right there); and on TLS, bytes still
 * encrypted in the kernel ({@code available()} counts only what is decrypted).
 */
final class JedisTracking extends Connection implements TrackingConnection {
  private static final byte[] INVALIDATE = "invalidate".getBytes(StandardCharsets.UTF_8);

  /** The connection's socket factory, which keeps the socket's {@link Received} reader. */
  private static final class Opener implements JedisSocketFactory {
    private final JedisSocketFactory inner;
    volatile Received received;

    Opener(HostAndPort address, JedisClientConfig config) {
      this.inner = new DefaultJedisSocketFactory(address, config);
    }

    @Override
    public Socket createSocket() {
      Socket s = inner.createSocket();
      try {
        received = Received.of(s.getInputStream());
      } catch (IOException e) {
        try {
          s.close();
        } catch (IOException ignored) {
          // failing anyway
        }
        throw new JedisConnectionException(e);
      }
      return s;
    }
  }

  /**
   * The socket's bytes as Jedis parses them, with the mark of bytes in hand: set by the reader as
   * soon as a read returns bytes, cleared by {@link #applied} once every byte read is parsed.
   */
  static final class Received extends RedisInputStream {
    /** The socket's stream, marking what its reads return. */
    private static final class Marking extends FilterInputStream {
      volatile boolean inHand;

      Marking(InputStream socket) {
        super(socket);
      }

      @Override
      public int read() throws IOException {
        int b = in.read();
        if (b >= 0) {
          inHand = true;
        }
        return b;
      }

      @Override
      public int read(byte[] b, int off, int len) throws IOException {
        int n = in.read(b, off, len);
        if (n > 0) {
          inHand = true;
        }
        return n;
      }
    }

    private final Marking marking;
    private final InputStream socket;

    private Received(Marking marking, InputStream socket) {
      super(marking);
      this.marking = marking;
      this.socket = socket;
    }

    static Received of(InputStream socket) {
      return new Received(new Marking(socket), socket);
    }

    /**
     * Nothing unread in the socket, then nothing in hand: in this order, so that bytes a read takes
     * between the two are seen by one of them (but for the instants before the mark is set).
     */
    boolean settled() {
      try {
        if (socket.available() > 0) {
          return false;
        }
      } catch (IOException closed) {
        return false;
      }
      return !marking.inHand;
    }

    /** The reader applied a frame: the mark goes once nothing read is left to parse. */
    void applied() {
      if (count >= limit) {
        marking.inHand = false;
      }
    }
  }

  private final TrackingConnection.Listener listener;
  private final ReentrantLock writing = new ReentrantLock();
  private final Deque<CompletableFuture<Object>> replies = new ArrayDeque<>();
  private final AtomicBoolean dropped = new AtomicBoolean();
  private final Received received;
  private final long id;

  /**
   * Opens it (blocking): connect, {@code HELLO 3}, {@code CLIENT TRACKING on}, {@code CLIENT ID}.
   */
  JedisTracking(HostAndPort address, JedisClientConfig config, TrackingConnection.Listener l) {
    this(address, resp3(config), l);
  }

  private JedisTracking(HostAndPort address, DefaultJedisClientConfig config, Listener l) {
    this(new Opener(address, config), config, l);
  }

  private JedisTracking(Opener opener, DefaultJedisClientConfig config, Listener l) {
    super(opener, config);
    // The handshake was read through Jedis' own stream; every read from here on goes through
    // this one (nothing was sent after the handshake's last reply: nothing is buffered there).
    this.received = opener.received;
    this.listener = l;
    addPushConsumer(
        ctx -> {
          PushMessage m = ctx.getMessage();
          if (Arrays.equals(m.getType(), INVALIDATE)) {
            List<Object> content = m.getContent();
            listener.invalidated(keys(content.size() > 1 ? content.get(1) : null));
            ctx.drop();
          }
          received.applied();
          return ctx;
        });
    try {
      sendCommand(JedisTransport.arguments(bytes("CLIENT"), bytes("TRACKING"), bytes("on")));
      getOne();
      sendCommand(JedisTransport.arguments(bytes("CLIENT"), bytes("ID")));
      Object r = getOne();
      this.id = r instanceof Long ? (Long) r : -1;
    } catch (RuntimeException e) {
      super.close();
      throw e;
    }
  }

  private static DefaultJedisClientConfig resp3(JedisClientConfig config) {
    return DefaultJedisClientConfig.builder()
        .from(config)
        .protocol(RedisProtocol.RESP3)
        // The reader waits for pushes as long as the connection lives.
        .socketTimeoutMillis(0)
        .build();
  }

  @Override
  protected Object protocolRead(RedisInputStream is, PushConsumerChain pushConsumers) {
    Received r = received;
    return super.protocolRead(r != null ? r : is, pushConsumers);
  }

  @Override
  protected void protocolReadPushes(RedisInputStream is, PushConsumerChain pushConsumers) {
    Received r = received;
    super.protocolReadPushes(r != null ? r : is, pushConsumers);
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  private static List<byte[]> keys(Object keys) {
    if (!(keys instanceof List)) {
      return null;
    }
    List<byte[]> out = new ArrayList<>();
    for (Object k : (List<?>) keys) {
      out.add(k instanceof byte[] ? (byte[]) k : bytes(String.valueOf(k)));
    }
    return out;
  }

  /** The reader: runs until the connection fails or is closed. */
  void read() {
    while (true) {
      Object reply;
      Throwable error = null;
      try {
        reply = getUnflushedObject();
      } catch (JedisDataException e) {
        reply = null;
        error = new WardenServerException(e.getMessage(), e);
      } catch (RuntimeException e) {
        drop(e);
        return;
      }
      CompletableFuture<Object> f;
      writing.lock();
      try {
        f = replies.poll();
      } finally {
        writing.unlock();
      }
      if (f == null) {
        drop(new WardenException("a reply nobody asked for"));
        return;
      }
      // A reply applies no invalidation (those before it are applied): whoever waits for it may
      // hit at once.
      received.applied();
      if (error != null) {
        f.completeExceptionally(error);
      } else {
        f.complete(JedisTransport.normalize(reply));
      }
    }
  }

  /** No hit while a delivered invalidation is unapplied: see {@link Received#settled}. */
  @Override
  public boolean settled() {
    return received.settled();
  }

  @Override
  public long clientId() {
    return id;
  }

  @Override
  public CompletionStage<Object> execute(byte[]... args) {
    CompletableFuture<Object> f = new CompletableFuture<>();
    CommandArguments ca = JedisTransport.arguments(args);
    RuntimeException failed = null;
    writing.lock();
    try {
      if (dropped.get()) {
        f.completeExceptionally(new WardenException("the tracking connection is closed"));
        return f;
      }
      replies.add(f);
      try {
        sendCommand(ca);
        flush();
      } catch (RuntimeException e) {
        failed = e;
      }
    } finally {
      writing.unlock();
    }
    if (failed != null) {
      // f fails with the drop, as every reply still awaited does.
      drop(failed);
    }
    return f;
  }

  private void drop(Throwable cause) {
    if (!dropped.compareAndSet(false, true)) {
      return;
    }
    try {
      super.close();
    } catch (RuntimeException alreadyBroken) {
      // closing flushes what is buffered, which fails on a broken socket: it is closed anyway
    }
    List<CompletableFuture<Object>> failed;
    writing.lock();
    try {
      failed = new ArrayList<>(replies);
      replies.clear();
    } finally {
      writing.unlock();
    }
    WardenException e = new WardenException("the tracking connection dropped", cause);
    for (CompletableFuture<Object> f : failed) {
      f.completeExceptionally(e);
    }
    listener.dropped(cause);
  }

  @Override
  public void close() {
    drop(new WardenException("the tracking connection was closed"));
  }
}
