package io.warden.jedis;

import io.warden.TrackingConnection;
import io.warden.WardenException;
import io.warden.WardenServerException;
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
import redis.clients.jedis.HostAndPort;
import redis.clients.jedis.JedisClientConfig;
import redis.clients.jedis.PushMessage;
import redis.clients.jedis.RedisProtocol;
import redis.clients.jedis.exceptions.JedisDataException;

/**
 * A near cache's tracking connection on Jedis: a RESP3 {@link Connection} (its {@code HELLO 3},
 * auth and TLS from the application's config) with {@code CLIENT TRACKING on}, read by a thread of
 * its own. Jedis hands each push to the connection's push consumers as it reads it, before it
 * returns the next reply, so invalidations and replies reach the near cache in the server's order;
 * commands from any thread are written under a lock, their replies matched in order.
 */
final class JedisTracking extends Connection implements TrackingConnection {
  private static final byte[] INVALIDATE = "invalidate".getBytes(StandardCharsets.UTF_8);

  private final TrackingConnection.Listener listener;
  private final ReentrantLock writing = new ReentrantLock();
  private final Deque<CompletableFuture<Object>> replies = new ArrayDeque<>();
  private final AtomicBoolean dropped = new AtomicBoolean();
  private final long id;

  /**
   * Opens it (blocking): connect, {@code HELLO 3}, {@code CLIENT TRACKING on}, {@code CLIENT ID}.
   */
  JedisTracking(HostAndPort address, JedisClientConfig config, TrackingConnection.Listener l) {
    super(
        address,
        DefaultJedisClientConfig.builder()
            .from(config)
            .protocol(RedisProtocol.RESP3)
            // The reader waits for pushes as long as the connection lives.
            .socketTimeoutMillis(0)
            .build());
    this.listener = l;
    addPushConsumer(
        ctx -> {
          PushMessage m = ctx.getMessage();
          if (Arrays.equals(m.getType(), INVALIDATE)) {
            List<Object> content = m.getContent();
            listener.invalidated(keys(content.size() > 1 ? content.get(1) : null));
            ctx.drop();
          }
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
      if (error != null) {
        f.completeExceptionally(error);
      } else {
        f.complete(JedisTransport.normalize(reply));
      }
    }
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
