package io.warden;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * One request that may wait (LOCK.ACQUIRE, RWLOCK.READ/WRITE, SEM.ACQUIRE, RATE.ACQUIRE,
 * CACHE.GET), following the client rule: a try without WAIT on the shared connection first; only a
 * busy answer waits, on a dedicated connection, with {@code WAIT} = the caller's remaining time
 * less a margin, computed when it is sent; nothing reaches a caller past its deadline or abort (a
 * grant that does is given back); an abort takes the waiter out of the server's queue at once
 * ({@code WARDEN.WITHDRAW}, else {@code CLIENT UNBLOCK}, else closing its connection).
 */
final class Attempt {
  /** What a reply means for one kind of request. */
  interface Kind {
    /** Whether the reply carries something for the caller (a token, a value, a fill lease). */
    boolean granted(Object reply);

    /** Undoes a granted reply nobody takes (release the token, abandon the lease). */
    CompletionStage<?> giveBack(Object reply);

    /**
     * Undoes a grant that may have been made to a waiter whose connection was closed unread (the
     * server granted it before it saw the close): release by owner; nothing where the close ends it
     * (a cache lease).
     */
    CompletionStage<?> giveBackUnseen();

    /**
     * Whether a grant lives only as long as the connection that won it (a cache fill lease): that
     * connection is kept out of the pool until {@link Attempt#releaseKept()}.
     */
    default boolean boundToConnection(Object reply) {
      return false;
    }

    /**
     * Whether a refused try is worth a wait that ends at {@code deadlineNanos}: a rate limiter's
     * tokens that cannot conform by then are not (the server would answer the same at once).
     */
    default boolean worthWaiting(Object refusal, long deadlineNanos) {
      return true;
    }

    /**
     * Whether {@link #giveBackUnseen()} undoes a grant nobody read (a release by owner). If not (a
     * rate limiter's tokens have no owner), an abort where {@code CLIENT UNBLOCK} cannot take the
     * waiter out has the server close its connection ({@code CLIENT KILL ID}) and reads it to its
     * end, so that a grant written before is read, and given back, instead of lost unread.
     */
    default boolean undoesUnseen() {
      return true;
    }

    /**
     * Whether an abort may take the waiter out with {@code WARDEN.WITHDRAW key owner} (the key and
     * owner are the command's first two arguments): a lock, read-write lock or semaphore request
     * whose owner was made for it, so that nothing else of that owner is queued on the key. Not a
     * rate limiter's or a cache's (no owner).
     */
    default boolean withdrawable() {
      return false;
    }
  }

  /** How long an abort waits, at most, for the server to be done with the waiter. */
  private static final long ABORT_BOUND_MS = 3000;

  private final Warden warden;
  private final byte[][] command;
  private final long deadline;
  private final long maxQueue;
  private final boolean mayWait;
  private final Kind kind;

  /** The granted reply; {@code null}: not granted (timeout, shed, abort). */
  final CompletableFuture<Object> result = new CompletableFuture<>();

  private final AtomicInteger inflight = new AtomicInteger();
  private final CompletableFuture<Void> idle = new CompletableFuture<>();
  private final ReentrantLock lock = new ReentrantLock();
  // Guarded by lock: the waiter connection and how far its request went. A connection goes back
  // to the pool only once its reply was read and the abort's take-out (WARDEN.WITHDRAW, then any
  // CLIENT UNBLOCK naming it) is done (else the UNBLOCK could hit the next request on it).
  private WaitConnection conn;
  private boolean replied;
  // A reply was read (not only a failed connection): a grant in it is handled where it is read.
  private boolean seen;
  // The take-out (takeOut) was started, and is done.
  private boolean unblockSent;
  private boolean unblockDone;
  // The server is closing the waiter connection (CLIENT KILL): it never goes back to the pool.
  private boolean killing;
  private boolean aborted;
  // The waiter connection a grant bound to it was won on, out of the pool until released.
  private WaitConnection kept;
  private volatile ScheduledFuture<?> timer;
  // The index of the lease argument in command (-1: none), and whether it was cut to the cap.
  private int leaseArg = -1;
  private boolean leaseCapped;
  // The grant was read from the wait (WAIT): the server granted it some time after it was sent.
  private volatile boolean grantWaited;
  // The last reply that granted nothing (the try's, then the wait's once it is sent): a rate
  // limiter's refusal says when to retry.
  private volatile Object refusal;

  Attempt(
      Warden warden,
      byte[][] command,
      long deadlineNanos,
      boolean mayWait,
      long maxQueue,
      Kind kind) {
    this.warden = warden;
    this.command = command;
    this.deadline = deadlineNanos;
    this.mayWait = mayWait;
    this.maxQueue = maxQueue;
    this.kind = kind;
  }

  /**
   * The lease is {@code command[index]}: refused as over {@code warden.max-lease}, the try is sent
   * again once with the lease cut to the cap the refusal names.
   */
  Attempt leaseAt(int index) {
    this.leaseArg = index;
    return this;
  }

  /**
   * Whether the grant came from the wait ({@code WAIT}): its lease began when the server granted
   * it, which may be long after the request was sent.
   */
  boolean grantWaited() {
    return grantWaited;
  }

  /**
   * What the server answered when it granted nothing: the try's reply, or the wait's once a wait
   * was sent ({@code null} when that wait ended unanswered: nil, a deadline, an abort).
   */
  Object refusal() {
    return refusal;
  }

  /** The lease the grant was asked with, in ms (after any cut to the cap). */
  long leaseSent() {
    return Long.parseLong(new String(command[leaseArg], StandardCharsets.UTF_8));
  }

  // The fast path's error: a lease over the cap is cut to it and tried again, once. (A request
  // that goes straight to the wait does so behind a request of this process on the same key,
  // whose try taught this Warden the cap already.)
  private boolean retriedAtTheCap(Throwable error) {
    if (leaseArg < 0 || leaseCapped || !warden.learnMaxLease(error)) {
      return false;
    }
    long asked = leaseSent();
    long capped = warden.capLease(asked);
    if (capped >= asked) {
      return false;
    }
    leaseCapped = true;
    command[leaseArg] = Resp.b(capped);
    start();
    return true;
  }

  /** Starts with the fast path: the command without WAIT on the shared connection. */
  Attempt start() {
    if (warden.closed()) {
      // A closed Warden starts nothing: no wait, and no hold its watchdog could never renew.
      fail(new WardenException("this Warden is closed"));
      return this;
    }
    if (mayWait && warden.waitingHere(queue()) > 0) {
      // A request of this process waits on the key: the server's queue is not empty, and a try
      // never overtakes a queued waiter. Straight to the wait, a round trip sooner.
      waitPhase();
      return this;
    }
    begin();
    warden
        .transport()
        .execute(command)
        .whenComplete(
            (reply, error) -> {
              try {
                if (error != null && retriedAtTheCap(error)) {
                  return;
                } else if (error != null) {
                  if (!(Resp.unwrap(error) instanceof WardenServerException)) {
                    // The connection failed with the try unanswered: the server may have granted
                    // it (it is never sent again), so what it granted is given back.
                    giveBackUnseen();
                  }
                  fail(error);
                } else if (kind.granted(reply)) {
                  deliver(reply);
                } else {
                  refusal = reply;
                  if (!mayWait || !kind.worthWaiting(reply, deadline)) {
                    result.complete(null);
                  } else {
                    waitPhase();
                  }
                }
              } catch (RuntimeException e) {
                fail(e);
              } finally {
                end();
              }
            });
    return this;
  }

  private void waitPhase() {
    if (isAborted() || result.isDone()) {
      return;
    }
    if (Deadline.waitArg(deadline, System.nanoTime()) < 0) {
      result.complete(null);
      return;
    }
    if (deadline != Deadline.FOREVER) {
      // The caller is answered at its deadline whatever the server does; the server's WAIT ends
      // before it, so a reply that comes later is rare, and a grant in it is given back.
      long delay = deadline - System.nanoTime();
      try {
        timer =
            warden.scheduler().schedule(() -> result.complete(null), delay, TimeUnit.NANOSECONDS);
      } catch (RejectedExecutionException closed) {
        fail(new WardenException("this Warden is closed"));
        return;
      }
      result.whenComplete((r, e) -> timer.cancel(false));
    }
    String queue = queue();
    warden.waiting(queue, 1);
    result.whenComplete((r, e) -> warden.waiting(queue, -1));
    begin();
    warden
        .transport()
        .waitConnection(deadline)
        .whenComplete(
            (c, error) -> {
              try {
                if (error != null) {
                  fail(error);
                } else if (c == null) {
                  result.complete(null);
                } else {
                  send(c);
                }
              } catch (RuntimeException e) {
                fail(e);
              } finally {
                end();
              }
            });
  }

  /** The server queue this request waits in: its command and key. */
  private String queue() {
    return new String(command[0], StandardCharsets.UTF_8)
        + ' '
        + new String(command[1], StandardCharsets.UTF_8);
  }

  private void send(WaitConnection c) {
    long wait = Deadline.waitArg(deadline, System.nanoTime());
    if (wait < 0 || result.isDone() || isAborted()) {
      c.release();
      result.complete(null);
      return;
    }
    int extra = maxQueue >= 0 ? 4 : 2;
    byte[][] full = Arrays.copyOf(command, command.length + extra);
    full[command.length] = Resp.b("WAIT");
    full[command.length + 1] = Resp.b(wait);
    if (maxQueue >= 0) {
      full[command.length + 2] = Resp.b("QUEUE");
      full[command.length + 3] = Resp.b(maxQueue);
    }
    lock.lock();
    boolean abortNow;
    try {
      conn = c;
      abortNow = aborted;
    } finally {
      lock.unlock();
    }
    begin();
    refusal = null;
    long readTimeout = wait == 0 ? 0 : wait + warden.readMarginMillis();
    c.execute(readTimeout, full)
        .whenComplete(
            (reply, error) -> {
              try {
                replied(
                    c,
                    error,
                    error == null && kind.granted(reply) && kind.boundToConnection(reply));
                if (error == null) {
                  if (kind.granted(reply)) {
                    grantWaited = true;
                    deliver(reply);
                  } else {
                    refusal = reply;
                    result.complete(null);
                  }
                } else {
                  fail(error);
                }
              } catch (RuntimeException e) {
                fail(e);
              } finally {
                end();
              }
            });
    if (abortNow) {
      takeOut();
    }
  }

  /** The wait's reply was read (or its connection failed): the connection's fate. */
  private void replied(WaitConnection c, Throwable error, boolean keep) {
    Throwable cause = error == null ? null : Resp.unwrap(error);
    boolean usable = cause == null || cause instanceof WardenServerException;
    boolean releaseNow;
    lock.lock();
    try {
      replied = true;
      seen = usable;
      releaseNow = !killing && (!unblockSent || unblockDone);
      if (usable && releaseNow && keep) {
        kept = c;
        releaseNow = false;
      }
    } finally {
      lock.unlock();
    }
    if (!usable || killing()) {
      c.close();
    } else if (releaseNow) {
      c.release();
    }
  }

  private boolean killing() {
    lock.lock();
    try {
      return killing;
    } finally {
      lock.unlock();
    }
  }

  private void deliver(Object reply) {
    if (isAborted()) {
      giveBack(reply);
    } else if (mayWait && Deadline.passed(deadline, System.nanoTime())) {
      // Rule: never a grant to a caller past its deadline. A try without a
      // wait (tryLock()) has no deadline to pass: Lock.tryLock() takes a free
      // lock, however long the round trip took.
      giveBack(reply);
      result.complete(null);
    } else if (!result.complete(reply)) {
      giveBack(reply);
    }
  }

  /** Gives back a granted reply nobody takes; the attempt is idle once that is answered. */
  void giveBack(Object reply) {
    begin();
    CompletionStage<?> stage;
    try {
      stage = kind.giveBack(reply);
    } catch (RuntimeException e) {
      releaseKept();
      end();
      return;
    }
    stage.whenComplete(
        (r, e) -> {
          releaseKept();
          end();
        });
  }

  /** Tracks a give-back made by the consumer of {@link #result} (its caller left). */
  void track(CompletionStage<?> stage) {
    begin();
    stage.whenComplete(
        (r, e) -> {
          releaseKept();
          end();
        });
  }

  private void giveBackUnseen() {
    begin();
    try {
      kind.giveBackUnseen().whenComplete((r, e) -> end());
    } catch (RuntimeException e) {
      end();
    }
  }

  /**
   * Returns to the pool the connection a grant bound to it was won on (once the grant was used: a
   * cache lease filled or abandoned). Nothing when there is none.
   */
  void releaseKept() {
    WaitConnection c;
    lock.lock();
    try {
      c = kept;
      kept = null;
    } finally {
      lock.unlock();
    }
    if (c != null) {
      c.release();
    }
  }

  private void fail(Throwable error) {
    if (!isAborted()) {
      result.completeExceptionally(Resp.unwrap(error));
    } else {
      result.complete(null);
    }
  }

  private boolean isAborted() {
    lock.lock();
    try {
      return aborted;
    } finally {
      lock.unlock();
    }
  }

  /**
   * The caller left (interrupt, cancel): answer it now and take the waiter out of the server's
   * queue. A grant that raced it is given back.
   */
  void abort() {
    boolean takeOut;
    lock.lock();
    try {
      if (aborted) {
        return;
      }
      aborted = true;
      takeOut = conn != null && !replied;
    } finally {
      lock.unlock();
    }
    result.complete(null);
    if (takeOut) {
      takeOut();
    }
  }

  /**
   * Takes the waiter out of the server's queue. First {@code WARDEN.WITHDRAW key owner} (a
   * withdrawable kind, on every server): the server answers the waiter nil on its connection, which
   * is kept. Where it took nothing out (a grant on its way, the request not on the server yet) or
   * is refused (a module before 1.1.0, an ACL), {@code CLIENT UNBLOCK} where the server answers the
   * waiter nil and keeps its connection (Redis &gt;= 7.4, Valkey &gt;= 8); else close the
   * connection, and wait (bounded) until the server no longer lists it, so the abort is ordered
   * before the caller's next command.
   */
  private void takeOut() {
    WaitConnection c;
    lock.lock();
    try {
      if (replied || unblockSent || conn == null) {
        return;
      }
      unblockSent = true;
      c = conn;
    } finally {
      lock.unlock();
    }
    begin();
    // True: the connection is kept (its reply, read or to come, ends the request there). Also when
    // WITHDRAW took nothing out but the reply was read meanwhile: nothing is left to take out.
    CompletionStage<Boolean> unblocked =
        withdraw()
            .thenCompose(
                withdrawn ->
                    withdrawn || replySeen()
                        ? CompletableFuture.completedFuture(true)
                        : unblockOrNot(c));
    unblocked.whenComplete(
        (ok, e) -> {
          try {
            boolean keep = e == null && Boolean.TRUE.equals(ok);
            boolean releaseNow;
            boolean kill;
            lock.lock();
            try {
              unblockDone = true;
              releaseNow = replied;
              kill = !keep && !replied && !kind.undoesUnseen() && c.clientId() > 0;
              killing = kill;
            } finally {
              lock.unlock();
            }
            if (kill) {
              kill(c);
            } else if (!keep) {
              c.close();
              begin();
              warden
                  .gone(c.clientId(), 1000)
                  .whenComplete(
                      (r, e2) -> {
                        boolean unseen;
                        lock.lock();
                        try {
                          unseen = !seen;
                        } finally {
                          lock.unlock();
                        }
                        if (unseen) {
                          begin();
                          try {
                            kind.giveBackUnseen().whenComplete((r2, e3) -> end());
                          } catch (RuntimeException e3) {
                            end();
                          }
                        }
                        end();
                      });
            } else if (releaseNow) {
              c.release();
            }
          } finally {
            end();
          }
        });
  }

  /**
   * {@code WARDEN.WITHDRAW key owner} for a withdrawable kind: true when the server took the waiter
   * out of its queue (its nil is on its way on the waiter connection).
   */
  private CompletionStage<Boolean> withdraw() {
    if (!kind.withdrawable() || command.length < 3) {
      return CompletableFuture.completedFuture(false);
    }
    return warden.withdraw(command[1], command[2]);
  }

  /** Whether the wait's reply was read (not only its connection failed). */
  private boolean replySeen() {
    lock.lock();
    try {
      return replied && seen;
    } finally {
      lock.unlock();
    }
  }

  /**
   * {@code CLIENT UNBLOCK} where it takes a module's waiter out (true: the connection is kept);
   * false where it cannot, or the connection has no client id: the caller closes it.
   */
  private CompletionStage<Boolean> unblockOrNot(WaitConnection c) {
    if (c.clientId() <= 0) {
      return CompletableFuture.completedFuture(false);
    }
    return warden
        .unblocksWaiters()
        .thenCompose(
            ok ->
                ok
                    ? unblock(c, System.nanoTime() + UNBLOCK_RETRY_NANOS)
                    : CompletableFuture.completedFuture(false));
  }

  /** How long an abort asks {@code CLIENT UNBLOCK} again for a request not yet on the server. */
  private static final long UNBLOCK_RETRY_NANOS = TimeUnit.SECONDS.toNanos(1);

  /**
   * {@code CLIENT UNBLOCK}: true when the waiter was taken out, or may be left to its reply. An
   * answer 0 means the reply is on its way, or the request has not reached the server yet: a
   * bounded {@code WAIT} answers it anyway (a grant is given back where it is read). A kind that
   * cannot undo an unseen grant asks again (every 2 ms, up to a second) until the waiter is taken
   * out or its reply read, so that it neither stays queued nor needs its connection killed.
   */
  private CompletionStage<Boolean> unblock(WaitConnection c, long until) {
    return warden
        .transport()
        .execute(Resp.args("CLIENT", "UNBLOCK", Long.toString(c.clientId())))
        .thenCompose(
            n -> {
              if (Long.valueOf(1).equals(Resp.asLong(n))) {
                return CompletableFuture.completedFuture(true);
              }
              if (kind.undoesUnseen()) {
                return CompletableFuture.completedFuture(deadline != Deadline.FOREVER);
              }
              boolean read;
              lock.lock();
              try {
                read = replied;
              } finally {
                lock.unlock();
              }
              if (read || System.nanoTime() - until > 0) {
                return CompletableFuture.completedFuture(read);
              }
              // Null when the Warden closed first: not taken out (the connection is closed).
              CompletableFuture<Boolean> again = new CompletableFuture<>();
              warden.retryLater(
                  again,
                  () ->
                      unblock(c, until)
                          .whenComplete(
                              (ok, e) -> {
                                if (e != null) {
                                  again.completeExceptionally(e);
                                } else {
                                  again.complete(ok);
                                }
                              }),
                  2);
              return again;
            });
  }

  /**
   * Has the server close the waiter connection ({@code CLIENT KILL ID}): the server drops the
   * waiter, which takes nothing, and the read in flight ends with the connection, after a grant
   * written before the kill, which is given back where it is read ({@link #deliver}).
   */
  private void kill(WaitConnection c) {
    if (warden.closed()) {
      // The shared connection is going: closing this one ends the waiter on the server as well.
      c.close();
      return;
    }
    begin();
    CompletionStage<Object> killed;
    try {
      killed =
          warden
              .transport()
              .execute(Resp.args("CLIENT", "KILL", "ID", Long.toString(c.clientId())));
    } catch (RuntimeException e) {
      CompletableFuture<Object> failed = new CompletableFuture<>();
      failed.completeExceptionally(e);
      killed = failed;
    }
    killed.whenComplete(
        (n, e) -> {
          try {
            if (e != null) {
              // Not killed (an ACL forbids it): closed here. A grant written to it unread is
              // lost: its tokens admit nobody (fewer admitted, never more).
              c.close();
            }
          } finally {
            end();
          }
        });
  }

  private void begin() {
    inflight.incrementAndGet();
  }

  private void end() {
    if (inflight.decrementAndGet() == 0 && result.isDone()) {
      idle.complete(null);
    }
  }

  /** Waits (uninterruptibly, bounded) until nothing of this attempt is left in flight. */
  void awaitIdle() {
    if (inflight.get() == 0) {
      return;
    }
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ABORT_BOUND_MS);
    boolean interrupted = false;
    while (true) {
      long left = end - System.nanoTime();
      if (left <= 0 || inflight.get() == 0) {
        break;
      }
      try {
        idle.get(Math.min(left, TimeUnit.MILLISECONDS.toNanos(50)), TimeUnit.NANOSECONDS);
        break;
      } catch (InterruptedException e) {
        interrupted = true;
      } catch (ExecutionException | TimeoutException e) {
        // look again
      }
    }
    if (interrupted) {
      Thread.currentThread().interrupt();
    }
  }

  // ---- turning a granted reply into what the caller gets ----

  /**
   * The caller's future: {@code wrap} turns a granted reply into the caller's object; when the
   * caller has left (cancelled, or completed the future itself) {@code undo} gives it back; {@code
   * started} runs once the caller has it (a watchdog).
   */
  <T> CompletableFuture<Optional<T>> deliverTo(
      Function<Object, T> wrap, Function<T, CompletionStage<?>> undo, Consumer<T> started) {
    return deliverTo(wrap, v -> CompletableFuture.completedFuture(true), undo, started);
  }

  /**
   * As {@link #deliverTo(Function, Function, Consumer)}, with {@code confirm} run on the caller's
   * object before the caller gets it: false (or failed), the grant is given back ({@code undo}) and
   * the caller is answered with nothing, as for a grant past its deadline.
   */
  <T> CompletableFuture<Optional<T>> deliverTo(
      Function<Object, T> wrap,
      Function<T, CompletionStage<Boolean>> confirm,
      Function<T, CompletionStage<?>> undo,
      Consumer<T> started) {
    CompletableFuture<Optional<T>> out = new CompletableFuture<>();
    result.whenComplete(
        (reply, error) -> {
          if (error != null) {
            out.completeExceptionally(error);
            return;
          }
          if (reply == null) {
            out.complete(Optional.empty());
            return;
          }
          T v;
          try {
            v = wrap.apply(reply);
          } catch (RuntimeException e) {
            giveBack(reply);
            out.completeExceptionally(e);
            return;
          }
          CompletionStage<Boolean> confirmed;
          try {
            confirmed = confirm.apply(v);
          } catch (RuntimeException e) {
            track(undo.apply(v));
            out.completeExceptionally(e);
            return;
          }
          // In flight until the caller has it or it is given back (an abort waits for it).
          begin();
          confirmed.whenComplete(
              (ok, e) -> {
                try {
                  if (e == null && Boolean.TRUE.equals(ok)) {
                    if (out.complete(Optional.of(v))) {
                      started.accept(v);
                    } else {
                      track(undo.apply(v));
                    }
                  } else {
                    track(undo.apply(v));
                    out.complete(Optional.empty());
                  }
                } finally {
                  end();
                }
              });
        });
    // Any other completion by the caller (cancel, a timeout of its own) is an abort.
    out.whenComplete(
        (v, e) -> {
          if (e != null) {
            abort();
          }
        });
    return out;
  }

  /**
   * Waits for the caller's future; on an interrupt the attempt is aborted (the waiter taken out, a
   * raced grant given back) before {@link InterruptedException} is thrown.
   */
  <T> Optional<T> await(CompletableFuture<Optional<T>> out, Function<T, CompletionStage<?>> undo)
      throws InterruptedException {
    try {
      Optional<T> got = out.get();
      if (got.isPresent() && mayWait && Deadline.passed(deadline, System.nanoTime())) {
        // Read in time, but this thread woke past the deadline: the caller has given up.
        track(undo.apply(got.get()));
        return Optional.empty();
      }
      return got;
    } catch (InterruptedException ie) {
      if (!out.cancel(true)) {
        Optional<T> got = null;
        try {
          got = out.getNow(null);
        } catch (RuntimeException e) {
          // failed: nothing to give back
        }
        if (got != null && got.isPresent()) {
          track(undo.apply(got.get()));
        }
      }
      abort();
      awaitIdle();
      Thread.interrupted();
      throw ie;
    } catch (ExecutionException e) {
      throw Resp.rethrow(e);
    }
  }
}
