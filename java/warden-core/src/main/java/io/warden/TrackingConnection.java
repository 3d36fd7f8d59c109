package io.warden;

import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/**
 * A dedicated RESP3 connection with {@code CLIENT TRACKING on} (default mode: no {@code BCAST}, no
 * {@code OPTIN}, no {@code REDIRECT}), read continuously in the background: what a {@link
 * NearCache} reads on. Its replies and the server's invalidation pushes reach the {@link Listener}
 * in the order the server sent them: a push is applied before any reply read after it completes.
 */
public interface TrackingConnection extends AutoCloseable {
  /** What the connection tells its near cache; called on the connection's reader thread. */
  interface Listener {
    /** The server invalidated {@code keys}; {@code null}: every key (a flush). */
    void invalidated(List<byte[]> keys);

    /** The connection closed, failed a read, or was closed: called at most once. */
    void dropped(Throwable cause);
  }

  /** {@code CLIENT ID} of the connection. */
  long clientId();

  /**
   * Sends one command (pipelined behind any in flight, from any thread) and completes with its
   * reply, mapped as {@link Transport#execute}.
   */
  CompletionStage<Object> execute(byte[]... args);

  /**
   * Where the transport follows a master that can move (Sentinel's): asks for the master now and,
   * when it moved, drops this connection (the listener is told before this completes). Completes at
   * once where there is no master to follow.
   */
  default CompletionStage<Void> checkMaster() {
    return CompletableFuture.completedFuture(null);
  }

  /**
   * Whether every byte the server has delivered to this connection has been read and applied: no
   * bytes wait unread in the socket, and none the reader has taken from it wait to be parsed, told
   * to the {@link Listener} or completed. A near cache serves a hit only while this holds, so that
   * no hit is served while a delivered invalidation is unapplied. Called on every hit, from any
   * thread: cheap, never blocking. The default, for a connection that cannot tell: {@code true}.
   */
  default boolean settled() {
    return true;
  }

  @Override
  void close();
}
