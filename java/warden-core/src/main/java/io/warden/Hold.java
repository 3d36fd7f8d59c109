package io.warden;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;

/**
 * One hold on the server (a lock, a read or write hold, semaphore permits), owned by this object
 * and not by a thread. A state machine guarded by a {@link ReentrantLock} (never {@code
 * synchronized}: virtual threads must not pin) keeps the watchdog's renewals and the release apart:
 * once the release is decided no renewal is sent, and the release waits for a renewal in flight, so
 * no EXTEND ever follows the release's reply.
 */
final class Hold implements WardenLock, Permit {
  enum Kind {
    LOCK("LOCK.RELEASE", "LOCK.EXTEND", null),
    READ("RWLOCK.UNLOCK", "RWLOCK.EXTEND", "READ"),
    WRITE("RWLOCK.UNLOCK", "RWLOCK.EXTEND", "WRITE"),
    SEMAPHORE("SEM.RELEASE", "SEM.EXTEND", null);

    final String release;
    final String extend;

    /**
     * {@code RWLOCK.UNLOCK}'s mode (module 1.1.0): the release ends a hold of this kind only;
     * without it a downgraded owner's write hold goes first.
     */
    final String mode;

    Kind(String release, String extend, String mode) {
      this.release = release;
      this.extend = extend;
      this.mode = mode;
    }
  }

  private enum State {
    HELD,
    RELEASING,
    RELEASED,
    LOST
  }

  private final Warden warden;
  private final Kind kind;
  private final String key;
  private final String owner;
  private final long fence;
  private final int permits;
  private final boolean watchdog;
  private final long askedMs;
  // The owner was made for this acquisition (in warden.freshHolds() until the hold ends).
  private final boolean ownOwner;
  // Set once another acquire named the owner (a downgrade's read): its release is never sent again.
  private volatile boolean shared;

  private final ReentrantLock lock = new ReentrantLock();
  // Guarded by lock.
  private State state = State.HELD;
  // The lease of each grant or renewal (at most the server's max-lease), and when the server's
  // lease ends by this client's clock (localEnd: at the latest 1 ms before it).
  private long leaseMs;
  private long leaseEnd;
  // Without the watchdog: when the lease that was asked for ends. Past leaseEnd (a lease asked
  // over max-lease) the hold is renewed, every third of leaseMs, up to it and no further.
  private long end;
  private int extendsInFlight;
  private CompletableFuture<Void> released;
  private boolean releaseSent;
  private ScheduledFuture<?> task;
  private final List<Runnable> onLost = new ArrayList<>();

  /**
   * Before an acquire naming {@code owner} is sent: a live hold of {@code warden} whose owner was
   * made for it is shared from then on. A release whose reply is lost is sent again only for an
   * owner no other acquire named: then a second release can end nothing but that hold. ({@link
   * Warden#freshHolds()}: bounded by the holds alive.)
   */
  static void lend(Warden warden, String owner) {
    Hold h = warden.freshHolds().get(owner);
    if (h != null) {
      h.shared = true;
    }
  }

  Hold(
      Warden warden,
      Kind kind,
      String key,
      String owner,
      long fence,
      int permits,
      long leaseMs,
      long askedMs,
      boolean watchdog,
      boolean ownOwner,
      long sentAtNanos) {
    this.warden = warden;
    this.ownOwner = ownOwner;
    this.kind = kind;
    this.key = key;
    this.owner = owner;
    this.fence = fence;
    this.permits = permits;
    this.leaseMs = leaseMs;
    this.watchdog = watchdog;
    this.askedMs = askedMs;
    // The lease started at the grant, after the request was sent: counting from the send is safe
    // (a grant that waited long is confirmed from a later send, see confirm).
    this.leaseEnd = localEnd(sentAtNanos, leaseMs);
    this.end = localEnd(sentAtNanos, Math.max(leaseMs, askedMs));
  }

  // The server's lease ends at its ms clock + ms (now_ms + ttl), up to 1 ms before the instant of
  // the grant + ms: by this client's clock it ends 1 ms earlier than anchor + ms.
  private static final long MARGIN_NANOS = TimeUnit.MILLISECONDS.toNanos(1);

  private static long localEnd(long anchorNanos, long ms) {
    return anchorNanos + TimeUnit.MILLISECONDS.toNanos(ms) - MARGIN_NANOS;
  }

  /**
   * Before the caller has the hold: a grant read from the wait ({@code waited}) began its lease
   * when the server granted it, at some time after {@code sentAtNanos}. Once more than a third of
   * the lease has passed since then, the lease counted from the send may already be over (or
   * nearly) while the server's runs on. An EXTEND for the same lease, sent now, restarts the
   * server's lease from a time this client knows, and the hold's lease is counted from its send.
   * False (EXTEND failed or answered 0): the grant is to be given back, as a late grant is.
   */
  CompletionStage<Boolean> confirm(boolean waited, long sentAtNanos) {
    if (ownOwner) {
      // Before the caller has it (start() may run after): an acquire naming its owner finds it.
      warden.freshHolds().put(owner, this);
    }
    long ms;
    lock.lock();
    try {
      ms = leaseMs;
    } finally {
      lock.unlock();
    }
    if (!waited || System.nanoTime() - sentAtNanos <= TimeUnit.MILLISECONDS.toNanos(ms) / 3) {
      return CompletableFuture.completedFuture(true);
    }
    long sent = System.nanoTime();
    CompletionStage<Object> reply;
    try {
      reply = sendExtend(ms);
    } catch (RuntimeException e) {
      return CompletableFuture.completedFuture(false);
    }
    return reply.handle(
        (r, error) -> {
          if (error != null || !Long.valueOf(1).equals(Resp.asLong(r))) {
            return false;
          }
          lock.lock();
          try {
            leaseEnd = localEnd(sent, ms);
            end = localEnd(sent, Math.max(ms, askedMs));
          } finally {
            lock.unlock();
          }
          return true;
        });
  }

  // Called with lock held: whether the hold is renewed (watchdog, or a lease asked over the cap).
  private boolean renews() {
    return watchdog || end - leaseEnd > 0;
  }

  /** The caller has the hold: renewals (watchdog) or the lease-end timer start. */
  void start() {
    lock.lock();
    try {
      if (state == State.HELD) {
        schedule();
      }
    } finally {
      lock.unlock();
    }
  }

  // Called with lock held.
  private void schedule() {
    if (task != null) {
      task.cancel(false);
    }
    if (renews()) {
      long every = Math.max(1, leaseMs / 3);
      task = warden.scheduler().schedule(this::renew, every, TimeUnit.MILLISECONDS);
    } else {
      long delay = leaseEnd - System.nanoTime();
      task = warden.scheduler().schedule(this::leaseEnded, delay, TimeUnit.NANOSECONDS);
    }
  }

  private void leaseEnded() {
    lock.lock();
    try {
      if (state != State.HELD) {
        return;
      }
      if (System.nanoTime() - leaseEnd < 0) {
        schedule();
        return;
      }
    } finally {
      lock.unlock();
    }
    lose();
  }

  private void renew() {
    long ms;
    lock.lock();
    try {
      if (state != State.HELD) {
        return;
      }
      long now = System.nanoTime();
      if (now - leaseEnd >= 0) {
        ms = -1;
      } else {
        extendsInFlight++;
        // Up to the end asked for, not past it: the last renewal ends the lease there.
        ms = watchdog ? leaseMs : Math.min(leaseMs, ceilMillis(end + MARGIN_NANOS - now));
      }
    } finally {
      lock.unlock();
    }
    if (ms < 0) {
      lose();
      return;
    }
    long sent = System.nanoTime();
    sendExtend(ms)
        .whenComplete(
            (reply, error) -> {
              boolean lost = false;
              lock.lock();
              try {
                extendsInFlight--;
                if (error == null && Long.valueOf(1).equals(Resp.asLong(reply))) {
                  leaseEnd = localEnd(sent, ms);
                } else if (error != null && warden.learnMaxLease(error)) {
                  // max-lease was lowered under this hold: renew at the new cap from now on.
                  leaseMs = warden.capLease(leaseMs);
                } else if (error == null) {
                  lost = state == State.HELD;
                } else {
                  // A renewal that failed (connection) is tried again at the next tick; the
                  // hold is lost once its lease has run out.
                  lost = state == State.HELD && System.nanoTime() - leaseEnd >= 0;
                }
                if (state == State.HELD && !lost) {
                  schedule();
                }
                maybeSendRelease();
              } finally {
                lock.unlock();
              }
              if (lost) {
                lose();
              }
            });
  }

  private static long ceilMillis(long nanos) {
    return Math.max(1, (nanos + 999_999) / 1_000_000);
  }

  private CompletionStage<Object> sendExtend(long ms) {
    return warden.transport().execute(Resp.args(kind.extend, key, owner, Long.toString(ms)));
  }

  private void lose() {
    List<Runnable> callbacks;
    lock.lock();
    try {
      if (state != State.HELD) {
        return;
      }
      state = State.LOST;
      warden.freshHolds().remove(owner, this);
      if (task != null) {
        task.cancel(false);
      }
      callbacks = new ArrayList<>(onLost);
      onLost.clear();
    } finally {
      lock.unlock();
    }
    for (Runnable r : callbacks) {
      runQuietly(r);
    }
  }

  private static void runQuietly(Runnable r) {
    try {
      r.run();
    } catch (RuntimeException e) {
      // a callback's failure is its own
    }
  }

  @Override
  public String key() {
    return key;
  }

  @Override
  public String owner() {
    return owner;
  }

  @Override
  public long fence() {
    return fence;
  }

  @Override
  public int permits() {
    return permits;
  }

  /** The lease of the last grant or renewal, in ms. */
  long leaseMillis() {
    lock.lock();
    try {
      return leaseMs;
    } finally {
      lock.unlock();
    }
  }

  /**
   * Resets the lease to {@code lease} from now. Over the server's {@code warden.max-lease} the
   * server's lease is the cap, renewed by this hold up to {@code lease} from now (a watchdog hold
   * keeps renewing at the new lease).
   */
  @Override
  public boolean extend(Duration lease) {
    long asked = LockRequest.leaseMillis(lease);
    long ms = warden.capLease(asked);
    lock.lock();
    try {
      if (state != State.HELD) {
        return false;
      }
      extendsInFlight++;
    } finally {
      lock.unlock();
    }
    long sent = System.nanoTime();
    Object reply = null;
    Throwable error = null;
    try {
      reply = sendExtend(ms).toCompletableFuture().join();
    } catch (RuntimeException e) {
      error = e;
    }
    if (error != null && warden.learnMaxLease(error) && warden.capLease(asked) < ms) {
      ms = warden.capLease(asked);
      error = null;
      sent = System.nanoTime();
      try {
        reply = sendExtend(ms).toCompletableFuture().join();
      } catch (RuntimeException e) {
        error = e;
      }
    }
    boolean ok = error == null && Long.valueOf(1).equals(Resp.asLong(reply));
    boolean lost = false;
    lock.lock();
    try {
      extendsInFlight--;
      if (ok && state == State.HELD) {
        leaseMs = ms;
        leaseEnd = localEnd(sent, ms);
        end = localEnd(sent, asked);
        schedule();
      } else if (error == null && !ok) {
        lost = state == State.HELD;
      }
      maybeSendRelease();
    } finally {
      lock.unlock();
    }
    if (lost) {
      lose();
    }
    if (error != null) {
      throw Resp.rethrow(error);
    }
    return ok;
  }

  @Override
  public boolean isHeld() {
    lock.lock();
    try {
      return state == State.HELD && System.nanoTime() - leaseEnd < 0;
    } finally {
      lock.unlock();
    }
  }

  /** Milliseconds left of the lease by this client's clock (0 once gone). */
  long remainingMillis() {
    lock.lock();
    try {
      if (state != State.HELD) {
        return 0;
      }
      return Math.max(0, TimeUnit.NANOSECONDS.toMillis(leaseEnd - System.nanoTime()));
    } finally {
      lock.unlock();
    }
  }

  @Override
  public void onLost(Runnable callback) {
    lock.lock();
    try {
      if (state != State.LOST) {
        onLost.add(callback);
        return;
      }
    } finally {
      lock.unlock();
    }
    runQuietly(callback);
  }

  @Override
  public void release() {
    try {
      releaseAsync().toCompletableFuture().join();
    } catch (RuntimeException e) {
      throw Resp.rethrow(e);
    }
  }

  /** Releases the hold; the stage completes with the server's answer to the release. */
  CompletionStage<Void> releaseAsync() {
    lock.lock();
    try {
      if (released == null) {
        released = new CompletableFuture<>();
        state = State.RELEASING;
        onLost.clear();
        if (task != null) {
          task.cancel(false);
        }
        maybeSendRelease();
      }
      return released;
    } finally {
      lock.unlock();
    }
  }

  // Called with lock held: the release goes once no renewal is in flight.
  private void maybeSendRelease() {
    if (released == null || releaseSent || extendsInFlight > 0) {
      return;
    }
    releaseSent = true;
    CompletableFuture<Void> done = released;
    warden
        .unlock(kind, key, owner, false)
        .whenComplete(
            (reply, error) -> {
              lock.lock();
              try {
                state = State.RELEASED;
              } finally {
                lock.unlock();
              }
              Throwable cause = error == null ? null : Resp.unwrap(error);
              if (cause != null
                  && ownOwner
                  && !shared
                  && !(cause instanceof WardenServerException)) {
                // No reply (the connection broke, the reply timed out): the release may not
                // have run, and the hold would stay until its lease ends, held by nobody. Sent
                // again on a new connection until answered or the lease would have ended. Safe:
                // the owner is this hold's alone, so a second release ends this hold or answers
                // that it holds nothing, never another's. The caller still gets the error.
                warden.untilAnswered(
                    () -> warden.unlock(kind, key, owner, false),
                    leaseEndNanos(),
                    () -> warden.freshHolds().remove(owner, this));
              } else {
                warden.freshHolds().remove(owner, this);
              }
              if (cause != null) {
                done.completeExceptionally(cause);
              } else {
                done.complete(null);
              }
            });
  }

  private long leaseEndNanos() {
    lock.lock();
    try {
      return leaseEnd;
    } finally {
      lock.unlock();
    }
  }

  @Override
  public void close() {
    release();
  }

  /** Gives back a hold its caller never took. */
  static CompletionStage<Void> releaseAsyncOf(WardenLock hold) {
    return ((Hold) hold).releaseAsync();
  }

  @Override
  public String toString() {
    return kind + " hold of " + key + " (owner " + owner + ", fence " + fence + ")";
  }
}
