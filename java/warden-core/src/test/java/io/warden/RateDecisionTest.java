package io.warden;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.Arrays;
import org.junit.jupiter.api.Test;

class RateDecisionTest {
  private static Object reply(long... words) {
    Object[] boxed = new Object[words.length];
    for (int i = 0; i < words.length; i++) {
      boxed[i] = words[i];
    }
    return Arrays.asList(boxed);
  }

  @Test
  void repliesReadAsDecisions() {
    RateDecision taken = RateDecision.of(reply(0, 2, 1, -1, 6000));
    assertTrue(taken.allowed());
    assertEquals(2, taken.limit());
    assertEquals(1, taken.remaining());
    assertEquals(Duration.ZERO, taken.retryAfter());
    assertEquals(Duration.ofMillis(6000), taken.resetAfter());
    assertTrue(RateDecision.allowed(reply(0, 2, 1, -1, 6000)));

    RateDecision limited = RateDecision.of(reply(1, 2, 0, 5985, 11985));
    assertFalse(limited.allowed());
    assertEquals(2, limited.limit());
    assertEquals(0, limited.remaining());
    assertEquals(Duration.ofMillis(5985), limited.retryAfter());
    assertEquals(Duration.ofMillis(11985), limited.resetAfter());
    assertFalse(RateDecision.allowed(reply(1, 2, 0, 5985, 11985)));
    assertFalse(RateDecision.allowed(null));

    assertThrows(WardenException.class, () -> RateDecision.of(reply(0, 1)));
    assertThrows(WardenException.class, () -> RateDecision.of(null));
  }

  @Test
  void infoReadsItsFields() {
    Object reply =
        Arrays.<Object>asList(
            "count".getBytes(),
            10L,
            "period".getBytes(),
            60000L,
            "burst".getBytes(),
            2L,
            "remaining".getBytes(),
            1L,
            "reset_after".getBytes(),
            5960L,
            "waiters".getBytes(),
            0L);
    RateInfo info = RateInfo.of(reply);
    assertEquals(10, info.count());
    assertEquals(Duration.ofMinutes(1), info.period());
    assertEquals(2, info.burst());
    assertEquals(1, info.remaining());
    assertEquals(Duration.ofMillis(5960), info.resetAfter());
    assertEquals(0, info.waiters());
    assertNull(RateInfo.of(null));
  }

  @Test
  void periodsAreWholeMilliseconds() {
    assertEquals(1000, RateLimiter.periodMillis(Duration.ofSeconds(1)));
    assertEquals(1, RateLimiter.periodMillis(Duration.ofMillis(1)));
    for (Duration bad :
        new Duration[] {
          Duration.ZERO, Duration.ofMillis(-1), Duration.ofNanos(1_500_000), Duration.ofNanos(1)
        }) {
      assertThrows(IllegalArgumentException.class, () -> RateLimiter.periodMillis(bad), "" + bad);
    }
  }
}
