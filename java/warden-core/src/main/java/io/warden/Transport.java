package io.warden;

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

  @Override
  void close();
}
