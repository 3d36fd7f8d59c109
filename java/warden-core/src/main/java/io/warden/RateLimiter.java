package io.warden;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;

/**
 * {@link WardenRateLimiter} on {@code RATE.*}. A request that waits is an {@link Attempt}, as a
 * lock's or a semaphore's is: a try without {@code WAIT} first, then the wait on a waiter
 * connection with the caller's remaining time, taken out of the server's queue on an abort.
 */
final class RateLimiter implements WardenRateLimiter {
  /** The rate every request states: {@code count} per {@code periodMs}, {@code burst} at once. */
  private static final class Rate {
    final long count;
    final long periodMs;
    // -1: the server's default, count (at most 10^9).
    final long burst;

    Rate(long count, long periodMs, long burst) {
      if (count < 1) {
        throw new IllegalArgumentException("count must be >= 1, not " + count);
      }
      if (burst != -1 && burst < 1) {
        throw new IllegalArgumentException("burst must be >= 1, not " + burst);
      }
      this.count = count;
      this.periodMs = periodMs;
      this.burst = burst;
    }

    /** The burst the server uses. */
    long effectiveBurst() {
      return burst > 0 ? burst : Math.min(count, 1_000_000_000L);
    }

    /** {@code name key count period [BURST burst]}, then {@code more}. */
    byte[][] command(String name, String key, Object... more) {
      List<Object> args = new ArrayList<>();
      args.add(name);
      args.add(key);
      args.add(count);
      args.add(periodMs);
      if (burst > 0) {
        args.add("BURST");
        args.add(burst);
      }
      for (Object m : more) {
        args.add(m);
      }
      return Resp.args(args.toArray());
    }
  }

  private final Warden warden;
  private final String key;
  private final long maxQueue;
  // Replaced by setRate: the rate this limiter's requests state from then on.
  private volatile Rate rate;

  RateLimiter(Warden warden, String key, long count, Duration period) {
    this(warden, key, new Rate(count, periodMillis(period), -1), -1);
  }

  private RateLimiter(Warden warden, String key, Rate rate, long maxQueue) {
    this.warden = warden;
    this.key = key;
    this.rate = rate;
    this.maxQueue = maxQueue;
  }

  /**
   * A period in whole ms, at least 1: a rate per part of a millisecond cannot be stated (the server
   * checks the upper bound, a day).
   */
  static long periodMillis(Duration period) {
    if (period.isNegative() || period.isZero() || period.getNano() % 1_000_000 != 0) {
      throw new IllegalArgumentException(
          "a period must be a positive whole number of ms, not " + period);
    }
    try {
      return period.toMillis();
    } catch (ArithmeticException e) {
      throw new IllegalArgumentException("a period must be at most a day, not " + period, e);
    }
  }

  private static void checkCost(long cost) {
    if (cost < 1) {
      throw new IllegalArgumentException("cost must be >= 1, not " + cost);
    }
  }

  @Override
  public String key() {
    return key;
  }

  @Override
  public WardenRateLimiter burst(long burst) {
    if (burst < 1) { // -1 is the unset default inside, never a value to give
      throw new IllegalArgumentException("burst must be >= 1, not " + burst);
    }
    Rate r = rate;
    return new RateLimiter(warden, key, new Rate(r.count, r.periodMs, burst), maxQueue);
  }

  @Override
  public WardenRateLimiter maxQueue(long n) {
    if (n < 0) {
      throw new IllegalArgumentException("maxQueue must be >= 0, not " + n);
    }
    return new RateLimiter(warden, key, rate, n);
  }

  /** What a {@code RATE.ACQUIRE} reply means to an {@link Attempt}, and how to give it back. */
  private Attempt.Kind kind(long cost) {
    return new Attempt.Kind() {
      @Override
      public boolean granted(Object reply) {
        return RateDecision.allowed(reply);
      }

      @Override
      public CompletionStage<?> giveBack(Object reply) {
        return refundAsync(cost);
      }

      @Override
      public CompletionStage<?> giveBackUnseen() {
        // Tokens have no owner: a refund for a grant nobody read could give back tokens that were
        // never taken, admitting more than the rate. A grant lost with its connection admits less.
        return CompletableFuture.completedFuture(null);
      }

      @Override
      public boolean undoesUnseen() {
        return false;
      }

      @Override
      public boolean worthWaiting(Object refusal, long deadlineNanos) {
        long wait = Deadline.waitArg(deadlineNanos, System.nanoTime());
        if (wait == 0) {
          return true;
        }
        List<Object> words =
            refusal instanceof List ? Resp.asList(refusal) : Collections.emptyList();
        Long retry = words.size() == 5 ? Resp.asLong(words.get(3)) : null;
        return wait > 0 && (retry == null || retry <= wait);
      }
    };
  }

  private CompletionStage<Object> refundAsync(long cost) {
    return warden.transport().execute(Resp.args("RATE.REFUND", key, cost));
  }

  private LockRequest.Pending<RateDecision> start(long cost, long deadline, boolean mayWait) {
    checkCost(cost);
    Rate r = rate;
    Attempt a =
        new Attempt(
            warden,
            r.command("RATE.ACQUIRE", key, "COST", cost),
            deadline,
            mayWait,
            maxQueue,
            kind(cost));
    CompletableFuture<Optional<RateDecision>> out =
        a.deliverTo(RateDecision::of, d -> refundAsync(cost), d -> {});
    a.start();
    return new LockRequest.Pending<>(a, out);
  }

  private LockRequest.Pending<RateDecision> startWithin(long cost, Duration wait) {
    long nanos = wait.isNegative() ? 0 : LockRequest.safeNanos(wait);
    return start(cost, Deadline.after(System.nanoTime(), nanos), nanos > 0);
  }

  /** The answer of a request that took nothing: the server's refusal, if the last reply was one. */
  private RateDecision refused(Attempt a) {
    Object reply = a.refusal();
    return reply instanceof List
        ? RateDecision.of(reply)
        : RateDecision.unanswered(rate.effectiveBurst());
  }

  @Override
  public RateDecision acquire(long cost) throws InterruptedException {
    LockRequest.Pending<RateDecision> p = start(cost, Deadline.FOREVER, true);
    return p.attempt.await(p.out, d -> refundAsync(cost)).orElseGet(() -> refused(p.attempt));
  }

  @Override
  public RateDecision acquire(long cost, Duration wait) throws InterruptedException {
    LockRequest.Pending<RateDecision> p = startWithin(cost, wait);
    return p.attempt.await(p.out, d -> refundAsync(cost)).orElseGet(() -> refused(p.attempt));
  }

  @Override
  public CompletionStage<RateDecision> acquireAsync(long cost, Duration wait) {
    LockRequest.Pending<RateDecision> p = startWithin(cost, wait);
    CompletableFuture<RateDecision> decision = new CompletableFuture<>();
    p.out.whenComplete(
        (got, e) -> {
          if (e != null) {
            decision.completeExceptionally(e);
          } else if (!got.isPresent()) {
            decision.complete(refused(p.attempt));
          } else if (!decision.complete(got.get())) {
            // The caller cancelled as the grant arrived: its tokens go back.
            p.attempt.track(refundAsync(cost));
          }
        });
    // The caller's cancel (or a timeout of its own) aborts the wait.
    decision.whenComplete(
        (d, e) -> {
          if (e != null) {
            p.out.cancel(true);
          }
        });
    return decision;
  }

  @Override
  public RateDecision tryAcquire(long cost) {
    checkCost(cost);
    return RateDecision.of(warden.execute(rate.command("RATE.ACQUIRE", key, "COST", cost)));
  }

  @Override
  public boolean refund(long cost) {
    checkCost(cost);
    return Long.valueOf(1).equals(Resp.asLong(warden.call("RATE.REFUND", key, cost)));
  }

  @Override
  public boolean setRate(long count, Duration period) {
    return setRate(new Rate(count, periodMillis(period), -1));
  }

  @Override
  public boolean setRate(long count, Duration period, long burst) {
    if (burst < 1) {
      throw new IllegalArgumentException("burst must be >= 1, not " + burst);
    }
    return setRate(new Rate(count, periodMillis(period), burst));
  }

  private boolean setRate(Rate next) {
    Object reply = warden.execute(next.command("RATE.CONFIG", key));
    rate = next;
    return Long.valueOf(1).equals(Resp.asLong(reply));
  }

  @Override
  public Optional<RateInfo> info() {
    return Optional.ofNullable(RateInfo.of(warden.call("RATE.INFO", key)));
  }

  @Override
  public String toString() {
    Rate r = rate;
    return "RateLimiter[key="
        + key
        + ", count="
        + r.count
        + ", periodMs="
        + r.periodMs
        + ", burst="
        + r.effectiveBurst()
        + (maxQueue >= 0 ? ", maxQueue=" + maxQueue : "")
        + "]";
  }
}
