package io.warden;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletionStage;

/**
 * A rate limiter on {@code RATE.*}: {@code count} tokens every {@code period}, at most {@code
 * burst} (default {@code count}) taken at once (GCRA, computed exactly by the server). Made by
 * {@link Warden#rateLimiter}; {@link #burst} and {@link #maxQueue} return a limiter with that
 * option, then {@link #acquire(long, Duration)} or {@link #tryAcquire} per request.
 *
 * <p>Every request states the rate: while the limiter exists the server refuses another one (a
 * {@link WardenServerException}, {@code ERR limiter rate is ...}), so that two versions of a
 * service cannot silently disagree on the bound; {@link #setRate} changes it on purpose.
 *
 * <p>A waiting request queues on the server, strictly FIFO, and is answered the millisecond its
 * tokens conform; one whose tokens cannot conform before its deadline is answered at once, not
 * allowed, with its {@link RateDecision#retryAfter()}. An interrupt, or cancelling the future of
 * {@link #acquireAsync}, takes the request out of the server's queue: it takes nothing, and tokens
 * of a grant that raced it are given back ({@code RATE.REFUND}).
 */
public interface WardenRateLimiter {
  String key();

  /** The same limiter with this burst: the most tokens taken at once (the bucket's size). */
  WardenRateLimiter burst(long burst);

  /**
   * The same limiter whose waits carry {@code QUEUE n}: with {@code n} or more requests already
   * waiting, a request is not queued and is answered at once (not allowed).
   */
  WardenRateLimiter maxQueue(long n);

  /**
   * {@code cost} tokens, waiting in the server's queue until they conform (or a {@link #maxQueue}
   * shed answers at once, not allowed).
   */
  RateDecision acquire(long cost) throws InterruptedException;

  /**
   * {@code cost} tokens, waiting up to {@code wait} (measured from this call) in the server's
   * queue; zero: one try without waiting. Not allowed when they cannot conform within it: answered
   * at once with the server's {@code retryAfter}, not after the deadline.
   */
  RateDecision acquire(long cost, Duration wait) throws InterruptedException;

  /**
   * As {@link #acquire(long, Duration)}, asynchronously. Cancelling the stage's future takes the
   * request out of the server's queue (a grant that raced it is given back).
   */
  CompletionStage<RateDecision> acquireAsync(long cost, Duration wait);

  /** {@code cost} tokens if they conform now and nobody waits ahead; never waits. */
  RateDecision tryAcquire(long cost);

  /**
   * Gives {@code cost} tokens back ({@code RATE.REFUND}, never beyond a full bucket): for a request
   * whose work did not happen. False: no limiter (its bucket is full), nothing changed.
   */
  boolean refund(long cost);

  /** {@link #setRate(long, Duration, long)} with the burst {@code count}. */
  boolean setRate(long count, Duration period);

  /**
   * Changes the limiter's rate ({@code RATE.CONFIG}), keeping the tokens already owed, and the rate
   * this limiter's requests state from then on (other limiter objects on the key, in this process
   * or others, must be made with the new rate). False: no limiter exists; the next request creates
   * it at the new rate.
   */
  boolean setRate(long count, Duration period, long burst);

  /** The limiter's state ({@code RATE.INFO}); empty when its bucket is full (no key). */
  Optional<RateInfo> info();
}
