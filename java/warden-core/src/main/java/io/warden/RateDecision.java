package io.warden;

import java.time.Duration;
import java.util.List;
import java.util.Objects;

/**
 * A limiter's answer to one request: {@code RATE.ACQUIRE}'s {@code [limited, burst, remaining,
 * retry_after, reset_after]}.
 */
public final class RateDecision {
  private final boolean allowed;
  private final long limit;
  private final long remaining;
  private final Duration retryAfter;
  private final Duration resetAfter;

  private RateDecision(
      boolean allowed, long limit, long remaining, Duration retryAfter, Duration resetAfter) {
    this.allowed = allowed;
    this.limit = limit;
    this.remaining = remaining;
    this.retryAfter = retryAfter;
    this.resetAfter = resetAfter;
  }

  /** The reply of {@code RATE.ACQUIRE}: five integers. */
  static RateDecision of(Object reply) {
    List<Object> words = reply instanceof List ? Resp.asList(reply) : null;
    if (words == null || words.size() != 5) {
      throw new WardenException("RATE.ACQUIRE answered " + reply + ", not 5 integers");
    }
    long[] n = new long[5];
    for (int i = 0; i < 5; i++) {
      Long v = Resp.asLong(words.get(i));
      n[i] = v == null ? 0 : v;
    }
    boolean allowed = n[0] == 0;
    return new RateDecision(
        allowed,
        Math.max(0, n[1]),
        Math.max(0, n[2]),
        allowed ? Duration.ZERO : Duration.ofMillis(Math.max(0, n[3])),
        Duration.ofMillis(Math.max(0, n[4])));
  }

  /** Whether {@code reply} took the tokens. */
  static boolean allowed(Object reply) {
    if (!(reply instanceof List)) {
      return false;
    }
    List<Object> words = Resp.asList(reply);
    return !words.isEmpty() && Long.valueOf(0).equals(Resp.asLong(words.get(0)));
  }

  /** Not allowed, with nothing known: a wait that ended without the server's answer. */
  static RateDecision unanswered(long limit) {
    return new RateDecision(false, limit, 0, Duration.ZERO, Duration.ZERO);
  }

  /** The tokens were taken. */
  public boolean allowed() {
    return allowed;
  }

  /** The limiter's burst: the most tokens taken at once (the bucket's size). */
  public long limit() {
    return limit;
  }

  /** Whole tokens left now. */
  public long remaining() {
    return remaining;
  }

  /**
   * When this request would conform (counting the requests waiting ahead of it), for one that was
   * not allowed; zero when allowed, or when a wait ended without the server's answer.
   */
  public Duration retryAfter() {
    return retryAfter;
  }

  /** When the bucket is full again. */
  public Duration resetAfter() {
    return resetAfter;
  }

  @Override
  public boolean equals(Object o) {
    if (!(o instanceof RateDecision)) {
      return false;
    }
    RateDecision d = (RateDecision) o;
    return allowed == d.allowed
        && limit == d.limit
        && remaining == d.remaining
        && retryAfter.equals(d.retryAfter)
        && resetAfter.equals(d.resetAfter);
  }

  @Override
  public int hashCode() {
    return Objects.hash(allowed, limit, remaining, retryAfter, resetAfter);
  }

  @Override
  public String toString() {
    return "RateDecision[allowed="
        + allowed
        + ", limit="
        + limit
        + ", remaining="
        + remaining
        + ", retryAfter="
        + retryAfter
        + ", resetAfter="
        + resetAfter
        + "]";
  }
}
