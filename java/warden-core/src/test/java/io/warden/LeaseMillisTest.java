package io.warden;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.time.Duration;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** A lease sent to the server is never shorter than the one asked: a part of a ms rounds up. */
class LeaseMillisTest {
  @Test
  void aPartOfAMillisecondRoundsUp() {
    assertEquals(1, LockRequest.leaseMillis(Duration.ofNanos(1)));
    assertEquals(1000, LockRequest.leaseMillis(Duration.ofMillis(1000)));
    assertEquals(1001, LockRequest.leaseMillis(Duration.ofMillis(1000).plusNanos(1)));
    assertEquals(1500, LockRequest.toMillis(1_500_000, TimeUnit.MICROSECONDS));
    assertEquals(1501, LockRequest.toMillis(1_500_001, TimeUnit.MICROSECONDS));
    assertEquals(2, LockRequest.toMillis(1_000_001, TimeUnit.NANOSECONDS));
    assertEquals(3000, LockRequest.toMillis(3, TimeUnit.SECONDS));
    assertEquals(Long.MAX_VALUE, LockRequest.toMillis(Long.MAX_VALUE, TimeUnit.DAYS));
    assertEquals(Long.MAX_VALUE, LockRequest.ceilMillis(Duration.ofSeconds(Long.MAX_VALUE)));
  }
}
