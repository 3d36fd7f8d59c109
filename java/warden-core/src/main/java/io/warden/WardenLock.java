package io.warden;

import java.time.Duration;

/**
 * One hold of a lock (exclusive, read or write). A hold owns itself, not a thread: it may be
 * released from any thread.
 */
public interface WardenLock extends AutoCloseable {
  String key();

  /** The owner the server knows this hold by (random, 128 bits, one per hold). */
  String owner();

  /** The fencing token: strictly increasing across holds, releases, expiries and restarts. */
  long fence();

  /**
   * Resets the lease to {@code lease} from now (over the server's {@code warden.max-lease}: the
   * cap, renewed until {@code lease} from now); false when the hold is gone.
   */
  boolean extend(Duration lease);

  /** False once released, lost (lease ended, renewal refused) or known to be gone. */
  boolean isHeld();

  /** Runs {@code callback} once when the hold is lost: its lease ended or a renewal failed. */
  void onLost(Runnable callback);

  /**
   * Releases the hold; idempotent; any thread. A release that gets no reply (the connection broke,
   * the reply timed out) throws, and is sent again on a new connection in the background until it
   * is answered or the lease would have ended: the hold's owner was made for it alone, so that ends
   * this hold, never another. Not when another acquire named the owner (a read taken under its own
   * write): that hold is left to its lease.
   */
  void release();

  /** Same as {@link #release()}. */
  @Override
  default void close() {
    release();
  }
}
