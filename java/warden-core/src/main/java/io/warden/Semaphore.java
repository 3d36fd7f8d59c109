package io.warden;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/** {@link DistributedSemaphore} on {@code SEM.*}: each acquire is a hold with its own owner. */
final class Semaphore implements DistributedSemaphore {
  private final Warden warden;
  private final String key;
  private final int limit;
  private final long maxQueue;

  Semaphore(Warden warden, String key, int limit, long maxQueue) {
    if (limit < 1) {
      throw new IllegalArgumentException("limit must be >= 1");
    }
    this.warden = warden;
    this.key = key;
    this.limit = limit;
    this.maxQueue = maxQueue;
  }

  /** The same semaphore with {@code QUEUE n}: a wait finding n or more waiters is shed. */
  @Override
  public DistributedSemaphore maxQueue(int n) {
    if (n < 0) {
      throw new IllegalArgumentException("maxQueue must be >= 0");
    }
    return new Semaphore(warden, key, limit, n);
  }

  private LockRequest.Pending<Permit> start(
      int permits, long deadline, boolean mayWait, Duration lease) {
    if (permits < 1 || permits > limit) {
      throw new IllegalArgumentException("permits must be from 1 to the limit, " + limit);
    }
    boolean dog = lease == null;
    long asked = dog ? warden.watchdogLeaseMillis() : LockRequest.leaseMillis(lease);
    long ms = warden.capLease(asked);
    String owner = warden.newOwner();
    long sent = System.nanoTime();
    Attempt a =
        new Attempt(
            warden,
            Resp.args(
                "SEM.ACQUIRE",
                key,
                owner,
                Long.toString(ms),
                "LIMIT",
                Integer.toString(limit),
                "PERMITS",
                Integer.toString(permits)),
            deadline,
            mayWait,
            maxQueue,
            warden.tokenKind(Hold.Kind.SEMAPHORE, key, owner, true));
    a.leaseAt(3);
    CompletableFuture<Optional<Permit>> out =
        a.deliverTo(
            reply ->
                new Hold(
                    warden,
                    Hold.Kind.SEMAPHORE,
                    key,
                    owner,
                    Resp.asLong(reply),
                    permits,
                    a.leaseSent(),
                    asked,
                    dog,
                    true,
                    sent),
            p -> ((Hold) p).confirm(a.grantWaited(), sent),
            p -> ((Hold) p).releaseAsync(),
            p -> ((Hold) p).start());
    a.start();
    return new LockRequest.Pending<>(a, out);
  }

  private static CompletionStage<Void> undo(Permit p) {
    return ((Hold) p).releaseAsync();
  }

  @Override
  public Optional<Permit> tryAcquire(int permits, Duration wait, Duration lease)
      throws InterruptedException {
    long nanos = wait.isNegative() ? 0 : LockRequest.safeNanos(wait);
    LockRequest.Pending<Permit> p =
        start(permits, Deadline.after(System.nanoTime(), nanos), nanos > 0, lease);
    return p.attempt.await(p.out, Semaphore::undo);
  }

  @Override
  public Permit acquire(int permits, Duration lease) throws InterruptedException {
    while (true) {
      LockRequest.Pending<Permit> p = start(permits, Deadline.FOREVER, true, lease);
      Optional<Permit> got = p.attempt.await(p.out, Semaphore::undo);
      if (got.isPresent()) {
        return got.get();
      }
      throw new WardenException(
          "not granted: "
              + key
              + " has too many waiters (maxQueue), or the grant was lost before it was confirmed");
    }
  }

  @Override
  public CompletionStage<Optional<Permit>> tryAcquireAsync(
      int permits, Duration wait, Duration lease) {
    long nanos = wait.isNegative() ? 0 : LockRequest.safeNanos(wait);
    return start(permits, Deadline.after(System.nanoTime(), nanos), nanos > 0, lease).out;
  }

  @Override
  public int availablePermits() {
    Object info = warden.call("SEM.INFO", key);
    if (info == null) {
      return limit;
    }
    Long lim = Resp.asLong(Resp.field(info, "limit"));
    Long used = Resp.asLong(Resp.field(info, "used"));
    return (int) Math.max(0, (lim == null ? limit : lim) - (used == null ? 0 : used));
  }
}
