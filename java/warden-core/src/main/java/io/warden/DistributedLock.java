package io.warden;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Lock;

/**
 * A {@link Lock} in Redisson's shape: re-entrant per thread (a per-thread hold count over one
 * server hold); {@link #unlock()} by a thread that does not hold it throws {@link
 * IllegalMonitorStateException}, and so does an {@link #unlock()} after the hold was lost (its
 * lease ended, or a renewal found it gone). Without a lease time the hold is renewed by a watchdog
 * while it is held. A lease time over the server's {@code warden.max-lease} is granted at the cap
 * and renewed until the lease asked for ends.
 */
public interface DistributedLock extends Lock {
  boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException;

  void lock(long leaseTime, TimeUnit unit);

  boolean isHeldByCurrentThread();

  int getHoldCount();

  /** Milliseconds left of the lease ({@code -2}: not held by anyone). */
  long remainTimeToLive();

  boolean isLocked();

  /** The current thread's hold's fencing token; {@link IllegalMonitorStateException} if none. */
  long fence();
}
