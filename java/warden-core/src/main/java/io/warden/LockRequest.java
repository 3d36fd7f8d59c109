package io.warden;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;

/**
 * How to take one hold: {@code warden.lock("k").lease(Duration.ofSeconds(10)).tryAcquire(wait)}.
 * Each acquire gets a fresh random owner (128 bits): a hold belongs to its {@link WardenLock}, not
 * to a thread.
 */
public final class LockRequest {
  private final Warden warden;
  private final Hold.Kind kind;
  private final String key;
  private long leaseMs = -1;
  private long watchdogMs;
  private long maxQueue = -1;
  private String owner;
  private String ownerTag;

  LockRequest(Warden warden, Hold.Kind kind, String key) {
    this.warden = warden;
    this.kind = kind;
    this.key = key;
    this.watchdogMs = warden.watchdogLeaseMillis();
  }

  /**
   * The lease; absent (or {@code null}): a watchdog renews the hold while it is held. Zero or
   * negative: {@link IllegalArgumentException} (not a lease that ends at once).
   */
  public LockRequest lease(Duration lease) {
    this.leaseMs = lease == null ? -1 : leaseMillis(lease);
    return this;
  }

  /**
   * A lease or extension in ms for the server: at least 1 (a part of a millisecond rounds up, so
   * that the lease this client counts never ends after the server's); zero, negative or over the
   * server's bound (2^46 ms) is refused here rather than sent.
   */
  static long leaseMillis(Duration lease) {
    if (lease.isZero() || lease.isNegative()) {
      throw new IllegalArgumentException("a lease must be positive, not " + lease);
    }
    long ms = Math.max(1, ceilMillis(lease));
    if (ms > Deadline.MAX_WAIT_MS) {
      throw new IllegalArgumentException("a lease must be at most 2^46 ms, not " + lease);
    }
    return ms;
  }

  /**
   * The watchdog's lease when no lease is given (default 30 s, the builder's): renewed every third
   * of it while held.
   */
  public LockRequest watchdog(Duration lease) {
    this.watchdogMs = Math.max(3, ceilMillis(lease));
    return this;
  }

  /**
   * {@code QUEUE n}: when {@code n} or more requests already wait on the key, do not queue; the
   * request is then reported as a timeout (shed).
   */
  public LockRequest maxQueue(int n) {
    if (n < 0) {
      throw new IllegalArgumentException("maxQueue must be >= 0");
    }
    this.maxQueue = n;
    return this;
  }

  /**
   * Prefixes the hold's fresh owner with {@code tag} ({@code tag/<random>}: still one owner per
   * hold), so that {@code LOCK.INFO} shows who holds it (ShedLock's provider tags its host).
   */
  public LockRequest ownerTag(String tag) {
    if (tag == null || tag.isEmpty()) {
      throw new IllegalArgumentException("an owner tag must not be empty");
    }
    this.ownerTag = tag;
    return this;
  }

  /** The owner to use instead of a fresh one (a downgrade names the writer's). */
  LockRequest owner(String owner) {
    this.owner = owner;
    return this;
  }

  /** Waits until granted; an interrupt leaves nothing behind (no hold, no waiter). */
  public WardenLock acquire() throws InterruptedException {
    Pending<WardenLock> p = start(Deadline.FOREVER, true);
    Optional<WardenLock> got = p.attempt.await(p.out, Hold::releaseAsyncOf);
    if (!got.isPresent()) {
      // Only a QUEUE shed, or a grant lost before it could be confirmed (Hold.confirm), answers a
      // wait without end with nothing.
      throw new WardenException(
          "not granted: "
              + key
              + " has too many waiters (maxQueue), or the grant was lost before it was confirmed");
    }
    return got.get();
  }

  /**
   * Waits up to {@code wait} (measured from this call); empty on timeout or shed. Zero: one try
   * without waiting.
   */
  public Optional<WardenLock> tryAcquire(Duration wait) throws InterruptedException {
    Pending<WardenLock> p = startWithin(wait);
    return p.attempt.await(p.out, Hold::releaseAsyncOf);
  }

  /**
   * As {@link #tryAcquire}, asynchronously. Cancelling the stage's future aborts the wait (the
   * waiter taken out, a grant that raced it given back).
   */
  public CompletionStage<Optional<WardenLock>> tryAcquireAsync(Duration wait) {
    return startWithin(wait).out;
  }

  private Pending<WardenLock> startWithin(Duration wait) {
    long now = System.nanoTime();
    long nanos = wait.isNegative() ? 0 : safeNanos(wait);
    return start(Deadline.after(now, nanos), nanos > 0);
  }

  static long safeNanos(Duration d) {
    try {
      return d.toNanos();
    } catch (ArithmeticException e) {
      return Long.MAX_VALUE;
    }
  }

  static final class Pending<T> {
    final Attempt attempt;
    final CompletableFuture<Optional<T>> out;

    Pending(Attempt attempt, CompletableFuture<Optional<T>> out) {
      this.attempt = attempt;
      this.out = out;
    }
  }

  Pending<WardenLock> start(long deadline, boolean mayWait) {
    boolean dog = leaseMs < 0;
    long asked = dog ? watchdogMs : leaseMs;
    // Over the server's max-lease: granted at the cap, renewed by the hold up to what was asked.
    long ms = warden.capLease(asked);
    if (this.owner != null) {
      Hold.lend(warden, this.owner); // before the send: see Hold.lend
    }
    String owner =
        this.owner != null
            ? this.owner
            : ownerTag != null ? ownerTag + "/" + warden.newOwner() : warden.newOwner();
    String cmd =
        kind == Hold.Kind.LOCK
            ? "LOCK.ACQUIRE"
            : kind == Hold.Kind.READ ? "RWLOCK.READ" : "RWLOCK.WRITE";
    long sent = System.nanoTime();
    Attempt a =
        new Attempt(
            warden,
            Resp.args(cmd, key, owner, Long.toString(ms)),
            deadline,
            mayWait,
            maxQueue,
            warden.tokenKind(kind, key, owner, this.owner == null));
    a.leaseAt(3);
    CompletableFuture<Optional<WardenLock>> out =
        a.deliverTo(
            reply ->
                new Hold(
                    warden,
                    kind,
                    key,
                    owner,
                    Resp.asLong(reply),
                    1,
                    a.leaseSent(),
                    asked,
                    dog,
                    this.owner == null,
                    sent),
            h -> ((Hold) h).confirm(a.grantWaited(), sent),
            h -> ((Hold) h).releaseAsync(),
            h -> ((Hold) h).start());
    a.start();
    return new Pending<>(a, out);
  }

  /** {@code amount} of {@code unit} in ms for the server: at least 1, a part of a ms rounded up. */
  static long toMillis(long amount, TimeUnit unit) {
    long ms = unit.toMillis(amount);
    if (ms < Long.MAX_VALUE && unit.convert(ms, TimeUnit.MILLISECONDS) < amount) {
      ms++;
    }
    return Math.max(1, ms);
  }

  /**
   * {@code d} in ms, a part of a millisecond rounded up (a ttl sent to the server is never cut
   * short); {@link Long#MAX_VALUE} when it does not fit.
   */
  static long ceilMillis(Duration d) {
    try {
      long ms = d.toMillis();
      return d.minusMillis(ms).isZero() ? ms : Math.addExact(ms, 1);
    } catch (ArithmeticException e) {
      return Long.MAX_VALUE;
    }
  }
}
