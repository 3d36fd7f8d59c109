package io.warden;

import java.util.concurrent.CompletionStage;

/** A connection that carries one blocking request at a time. */
public interface WaitConnection extends AutoCloseable {
  /** {@code CLIENT ID}, learned when it opened ({@code -1} when the server refused it). */
  long clientId();

  /**
   * Sends one command and reads its reply (mapped as {@link Transport#execute}); never retried or
   * re-sent. With no reply within {@code replyTimeoutMillis} (0: no limit) the stage fails and the
   * connection is closed.
   */
  CompletionStage<Object> execute(long replyTimeoutMillis, byte[]... args);

  /** Back to the pool (only after its reply was read). */
  void release();

  /**
   * Discards it (after an abort the server could not answer on it: {@code WARDEN.WITHDRAW} and
   * {@code CLIENT UNBLOCK} refused or unable; or a lost reply).
   */
  @Override
  void close();
}
