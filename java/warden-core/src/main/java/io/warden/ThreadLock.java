package io.warden;

import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;

/**
 * The {@link DistributedLock} facade: re-entrant per thread (a per-thread hold count over one
 * server hold with its own random owner); only the thread that locked may unlock.
 */
final class ThreadLock implements DistributedLock {
  private final Warden warden;
  private final Hold.Kind kind;
  private final String key;

  ThreadLock(Warden warden, Hold.Kind kind, String key) {
    this.warden = warden;
    this.kind = kind;
    this.key = key;
  }

  private ThreadHolds.Key mine() {
    return new ThreadHolds.Key(kind, key, Thread.currentThread());
  }

  private ThreadHolds.Entry entry() {
    return warden.threadHolds().get(mine());
  }

  /**
   * Re-entry: true when the current thread holds it already (its count goes up). A hold whose lease
   * ended (or whose renewal failed) is no hold: another client may have the lock by now, so the
   * thread's entry is dropped and the caller acquires afresh (the outer unlock() then throws
   * IllegalMonitorStateException, as for any lock the thread no longer holds).
   */
  private boolean reenter() {
    ThreadHolds.Entry e = entry();
    if (e == null) {
      return false;
    }
    if (!e.hold.isHeld()) {
      warden.threadHolds().remove(mine(), e);
      e.hold.releaseAsync();
      return false;
    }
    e.count++;
    return true;
  }

  /**
   * The owner a new hold of this thread must use: a downgrade (read while writing) or an upgrade
   * (refused by the server) names the thread's other hold on the key; otherwise a fresh one.
   */
  private String ownerFor() {
    Hold.Kind other =
        kind == Hold.Kind.READ ? Hold.Kind.WRITE : kind == Hold.Kind.WRITE ? Hold.Kind.READ : null;
    if (other != null) {
      ThreadHolds.Entry e =
          warden.threadHolds().get(new ThreadHolds.Key(other, key, Thread.currentThread()));
      if (e != null) {
        return e.hold.owner();
      }
    }
    return null;
  }

  private Optional<WardenLock> take(long deadline, boolean mayWait, long leaseMs)
      throws InterruptedException {
    LockRequest r = new LockRequest(warden, kind, key).owner(ownerFor());
    if (leaseMs > 0) {
      r.lease(java.time.Duration.ofMillis(leaseMs));
    }
    LockRequest.Pending<WardenLock> p = r.start(deadline, mayWait);
    Optional<WardenLock> got = p.attempt.await(p.out, Hold::releaseAsyncOf);
    got.ifPresent(h -> warden.threadHolds().put(mine(), new ThreadHolds.Entry((Hold) h)));
    return got;
  }

  private boolean tryTake(long waitNanos, long leaseMs) throws InterruptedException {
    if (Thread.interrupted()) {
      throw new InterruptedException();
    }
    if (reenter()) {
      return true;
    }
    long deadline = Deadline.after(System.nanoTime(), Math.max(0, waitNanos));
    return take(deadline, waitNanos > 0, leaseMs).isPresent();
  }

  private void takeUninterruptibly(long leaseMs) {
    if (reenter()) {
      return;
    }
    boolean interrupted = false;
    try {
      while (true) {
        try {
          if (take(Deadline.FOREVER, true, leaseMs).isPresent()) {
            return;
          }
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  @Override
  public void lock() {
    takeUninterruptibly(-1);
  }

  /** A {@code leaseTime} of 0 or less: no lease, the watchdog renews (Redisson's -1). */
  @Override
  public void lock(long leaseTime, TimeUnit unit) {
    takeUninterruptibly(leaseTime <= 0 ? -1 : LockRequest.toMillis(leaseTime, unit));
  }

  @Override
  public void lockInterruptibly() throws InterruptedException {
    if (Thread.interrupted()) {
      throw new InterruptedException();
    }
    if (reenter()) {
      return;
    }
    while (!take(Deadline.FOREVER, true, -1).isPresent()) {
      // only a shed answers a wait without end empty; try again
    }
  }

  @Override
  public boolean tryLock() {
    if (reenter()) {
      return true;
    }
    // Not an interruptible method: a pending interrupt neither refuses a free lock nor is lost.
    boolean interrupted = Thread.interrupted();
    try {
      while (true) {
        try {
          return take(System.nanoTime(), false, -1).isPresent();
        } catch (InterruptedException e) {
          interrupted = true;
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  @Override
  public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
    return tryTake(unit.toNanos(time), -1);
  }

  @Override
  public boolean tryLock(long waitTime, long leaseTime, TimeUnit unit) throws InterruptedException {
    return tryTake(
        unit.toNanos(waitTime), leaseTime <= 0 ? -1 : LockRequest.toMillis(leaseTime, unit));
  }

  @Override
  public void unlock() {
    ThreadHolds.Key k = mine();
    ThreadHolds.Entry e = warden.threadHolds().get(k);
    if (e == null) {
      throw new IllegalMonitorStateException(
          "attempt to unlock " + key + ", not locked by the current thread");
    }
    if (--e.count > 0) {
      return;
    }
    warden.threadHolds().remove(k, e);
    boolean lost = !e.hold.isHeld();
    e.hold.release();
    if (lost) {
      // As Redisson's unlock of a lock whose lease ran out: the caller must hear of it.
      throw new IllegalMonitorStateException(
          key
              + " was lost before unlock (its lease ended or a renewal was refused): what it"
              + " protected may have been changed by another holder");
    }
  }

  @Override
  public Condition newCondition() {
    throw new UnsupportedOperationException("conditions are not supported by distributed locks");
  }

  @Override
  public boolean isHeldByCurrentThread() {
    ThreadHolds.Entry e = entry();
    return e != null && e.hold.isHeld();
  }

  @Override
  public int getHoldCount() {
    ThreadHolds.Entry e = entry();
    return e == null ? 0 : e.count;
  }

  @Override
  public long remainTimeToLive() {
    Long ttl = Resp.asLong(warden.call("PTTL", key));
    return ttl == null ? -2 : ttl;
  }

  @Override
  public boolean isLocked() {
    if (kind == Hold.Kind.LOCK) {
      return warden.call("LOCK.INFO", key) != null;
    }
    Object info = warden.call("RWLOCK.INFO", key);
    if (info == null) {
      return false;
    }
    return kind == Hold.Kind.READ || "write".equals(Resp.str(Resp.field(info, "mode")));
  }

  @Override
  public long fence() {
    ThreadHolds.Entry e = entry();
    if (e == null) {
      throw new IllegalMonitorStateException(key + " is not locked by the current thread");
    }
    return e.hold.fence();
  }

  @Override
  public String toString() {
    return "DistributedLock(" + kind + " " + key + ")";
  }
}
