package io.warden;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/**
 * How warden talks to a server: one command at a time on a shared connection, and dedicated
 * connections for blocking waits. {@code warden-lettuce} and {@code warden-jedis} provide one.
 */
public interface Transport extends AutoCloseable {
  /**
   * One command on a shared (multiplexed or pooled) connection. Reply mapping: integer {@code ->
   * Long}, bulk {@code -> byte[]}, simple string {@code -> String}, array {@code -> List<Object>},
   * nil {@code -> null}; an error reply completes exceptionally with {@link WardenServerException}
   * (message = the server's text).
   */
  CompletionStage<Object> execute(byte[]... args);

  /**
   * A dedicated connection for one blocking wait (from a small bounded pool, reused after a clean
   * reply); waiting for one counts against the caller's deadline. Completes with {@code null} when
   * {@code deadlineNanos} (a {@link System#nanoTime()} value) passes first.
   */
  CompletionStage<WaitConnection> waitConnection(long deadlineNanos);

  /**
   * Opens a {@link TrackingConnection} for a {@link NearCache} to the server the transport talks to
   * (its Sentinel master where it follows one), telling {@code listener} its invalidations and its
   * drop. A transport that cannot open one completes exceptionally with {@link
   * UnsupportedOperationException}.
   */
  default CompletionStage<TrackingConnection> trackingConnection(
      TrackingConnection.Listener listener) {
    CompletableFuture<TrackingConnection> f = new CompletableFuture<>();
    f.completeExceptionally(
        new UnsupportedOperationException("this transport opens no tracking connection"));
    return f;
  }

  @Override
  void close();
}
