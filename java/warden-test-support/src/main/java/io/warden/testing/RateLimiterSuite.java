package io.warden.testing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.warden.RateDecision;
import io.warden.RateInfo;
import io.warden.Warden;
import io.warden.WardenRateLimiter;
import io.warden.WardenServerException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;

/**
 * The rate limiter ({@code RATE.*}) against real servers, through one transport (each transport
 * module runs it). Most limiters here give 10 tokens a day, so that time does not move their state
 * during a test: waiters are granted by refunds, and every assertion is on order and counts.
 */
public abstract class RateLimiterSuite extends TransportSuite {
  private static final Duration DAY = Duration.ofDays(1);
  // One token of 10 a day, in ms.
  private static final long TOKEN_MS = DAY.toMillis() / 10;
  // Longer than any of these limiters takes to refill: a waiter waits until a refund serves it.
  private static final Duration LONG_WAIT = Duration.ofDays(2);

  private static void waitUntil(String what, BooleanSupplier condition) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!condition.getAsBoolean()) {
      if (System.nanoTime() - end > 0) {
        fail("not within 10 s: " + what);
      }
      sleep(2);
    }
  }

  private static long waiters(WardenRateLimiter limiter) {
    return limiter.info().map(RateInfo::waiters).orElse(0L);
  }

  private static long remaining(WardenRateLimiter limiter) {
    return limiter.info().map(RateInfo::remaining).orElse(-1L);
  }

  /** 10 a day with {@code burst}, emptied. */
  private WardenRateLimiter empty(String name, long burst) {
    WardenRateLimiter limiter = warden.rateLimiter(key(name), 10, DAY).burst(burst);
    assertTrue(limiter.tryAcquire(burst).allowed());
    return limiter;
  }

  @Test
  void allowedThenLimitedWithTheServersReply() {
    WardenRateLimiter limiter = warden.rateLimiter(key("api"), 10, DAY).burst(2);
    RateDecision first = limiter.tryAcquire(1);
    assertTrue(first.allowed(), first.toString());
    assertEquals(2, first.limit());
    assertEquals(1, first.remaining());
    assertEquals(Duration.ZERO, first.retryAfter());
    assertNear(TOKEN_MS, first.resetAfter());

    RateDecision second = limiter.tryAcquire(1);
    assertTrue(second.allowed(), second.toString());
    assertEquals(0, second.remaining());
    assertNear(2 * TOKEN_MS, second.resetAfter());

    RateDecision third = limiter.tryAcquire(1);
    assertFalse(third.allowed(), third.toString());
    assertEquals(2, third.limit());
    assertEquals(0, third.remaining());
    assertNear(TOKEN_MS, third.retryAfter());
    assertNear(2 * TOKEN_MS, third.resetAfter());

    RateInfo info = limiter.info().get();
    assertEquals(10, info.count());
    assertEquals(DAY, info.period());
    assertEquals(2, info.burst());
    assertEquals(0, info.remaining());
    assertEquals(0, info.waiters());
    assertNear(2 * TOKEN_MS, info.resetAfter());
  }

  /** {@code d} is {@code ms} less what the test's own time may have taken (10 s at most). */
  private static void assertNear(long ms, Duration d) {
    assertTrue(d.toMillis() <= ms && d.toMillis() > ms - 10_000, d + " is not about " + ms + " ms");
  }

  @Test
  void infoOnAMissingKeyIsEmpty() {
    assertEquals(Optional.empty(), warden.rateLimiter(key("none"), 10, DAY).info());
  }

  @Test
  void aWaitIsGrantedWhenItsTokensConform() throws Exception {
    // 10 a second: the next token is 100 ms away, within the wait.
    WardenRateLimiter limiter = warden.rateLimiter(key("soon"), 10, Duration.ofSeconds(1)).burst(1);
    assertTrue(limiter.tryAcquire(1).allowed());
    RateDecision d = limiter.acquire(1, Duration.ofSeconds(20));
    assertTrue(d.allowed(), d.toString());
    assertEquals(0, d.remaining());
    assertEquals(0, server.wardenInfo("waiting_clients"));
  }

  @Test
  void waitersAreGrantedInTheOrderTheyAsked() throws Exception {
    WardenRateLimiter limiter = empty("fifo", 10);
    CompletableFuture<RateDecision> first =
        limiter.acquireAsync(2, LONG_WAIT).toCompletableFuture();
    waitUntil("the first waits", () -> waiters(limiter) == 1);
    CompletableFuture<RateDecision> second =
        limiter.acquireAsync(1, LONG_WAIT).toCompletableFuture();
    waitUntil("the second waits", () -> waiters(limiter) == 2);

    // One token: enough for the second, not for the first, which it does not overtake.
    assertTrue(limiter.refund(1));
    assertEquals(2, waiters(limiter));
    assertFalse(first.isDone() || second.isDone());

    assertTrue(limiter.refund(1));
    RateDecision a = first.get(10, TimeUnit.SECONDS);
    assertTrue(a.allowed(), a.toString());
    assertEquals(1, waiters(limiter));
    assertFalse(second.isDone());

    assertTrue(limiter.refund(1));
    RateDecision b = second.get(10, TimeUnit.SECONDS);
    assertTrue(b.allowed(), b.toString());
    assertEquals(0, waiters(limiter));
    assertEquals(0, remaining(limiter));
  }

  @Test
  void aWaitThatCannotConformInTimeIsAnsweredAtOnce() throws Exception {
    String k = key("far");
    RecordingTransport rec = new RecordingTransport(transport(server));
    try (Warden w = Warden.create(rec)) {
      WardenRateLimiter limiter = w.rateLimiter(k, 10, DAY).burst(1);
      assertTrue(limiter.tryAcquire(1).allowed());

      // The try says the token is hours away: no wait is sent.
      long t0 = System.nanoTime();
      RateDecision d = limiter.acquire(1, Duration.ofSeconds(20));
      assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(20), "answered at once");
      assertFalse(d.allowed());
      assertNear(TOKEN_MS, d.retryAfter());
      assertEquals(0, rec.waitConnectionsAsked());

      // Behind a waiter of this process, a request goes straight to the server's queue, which
      // answers at once: with the waiter ahead its token is two tokens away.
      CompletableFuture<RateDecision> ahead =
          limiter.acquireAsync(1, LONG_WAIT).toCompletableFuture();
      waitUntil("a waiter", () -> waiters(limiter) == 1);
      t0 = System.nanoTime();
      RateDecision behind = limiter.acquire(1, Duration.ofSeconds(20));
      assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(20), "answered at once");
      assertFalse(behind.allowed(), behind.toString());
      assertNear(2 * TOKEN_MS, behind.retryAfter());
      assertEquals(2, rec.waits().size(), rec.waits().toString());
      List<String> sent = rec.waits().get(1);
      assertEquals("RATE.ACQUIRE", sent.get(0));
      assertTrue(sent.contains("WAIT"), sent.toString());
      assertFalse(ahead.isDone());

      // Neither answer took anything, and the waiter is still first.
      assertEquals(0, remaining(limiter));
      assertTrue(limiter.refund(1));
      assertTrue(ahead.get(10, TimeUnit.SECONDS).allowed());
      assertEquals(0, waiters(limiter));
    }
  }

  /**
   * The refund's 5 tokens are for the next caller: the wait that left took nothing, or gave back a
   * grant that raced it; they are taken, emptying the limiter again. Where only closing its
   * connection takes a waiter out (Redis &lt; 7.4: no {@code CLIENT UNBLOCK} of module waiters), a
   * grant the server wrote just before the close can be lost with it: fewer admitted, never more.
   */
  private void tokensBack(WardenRateLimiter limiter, String where) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(server.unblocksWaiters() ? 10 : 4);
    while (!limiter.tryAcquire(5).allowed()) {
      long left = remaining(limiter);
      assertTrue(left == 0 || left == 5, where + ": " + left + " tokens");
      if (System.nanoTime() - end > 0) {
        assertFalse(server.unblocksWaiters(), where + ": the 5 tokens are not back");
        return;
      }
      sleep(2);
    }
  }

  @Test
  void anInterruptedWaitTakesNothingAndARacedGrantIsGivenBack() throws Exception {
    WardenRateLimiter limiter = empty("interrupt", 10);
    for (int round = 0; round < 12; round++) {
      AtomicReference<Object> outcome = new AtomicReference<>();
      CountDownLatch started = new CountDownLatch(1);
      Thread t =
          new Thread(
              () -> {
                started.countDown();
                try {
                  outcome.set(limiter.acquire(5));
                } catch (InterruptedException e) {
                  outcome.set("interrupted");
                } catch (Throwable e) {
                  outcome.set(e);
                }
              });
      t.start();
      started.await();
      // Rounds vary when the interrupt comes: before the wait is sent, while it waits, and in the
      // same instant as the refund that grants it (the grant then races the abort).
      if (round % 4 == 1) {
        waitUntil("the waiter", () -> waiters(limiter) == 1);
      } else if (round % 4 == 2) {
        sleep(2);
      }
      if (round % 3 == 2) {
        assertTrue(limiter.refund(5));
        t.interrupt();
      } else {
        t.interrupt();
        t.join(20_000);
        assertTrue(limiter.refund(5));
      }
      t.join(20_000);
      assertFalse(t.isAlive());
      Object o = outcome.get();
      if (o instanceof RateDecision) {
        // The grant won the race before the interrupt was seen: the caller has the 5 tokens.
        assertTrue(((RateDecision) o).allowed(), o.toString());
        assertEquals(0, remaining(limiter), "round " + round);
      } else {
        assertEquals("interrupted", o, "round " + round);
        tokensBack(limiter, "round " + round);
      }
      assertEquals(0, waiters(limiter), "round " + round);
      assertEquals(0, server.wardenInfo("waiting_clients"));
    }
  }

  @Test
  void aCancelledAsyncWaitTakesNothingAndARacedGrantIsGivenBack() throws Exception {
    for (int round = 0; round < 10; round++) {
      // A key per round: the cancel returns before the abort is done.
      WardenRateLimiter limiter = empty("cancel" + round, 10);
      CompletableFuture<RateDecision> f = limiter.acquireAsync(5, LONG_WAIT).toCompletableFuture();
      if (round % 2 == 0) {
        waitUntil("the waiter", () -> waiters(limiter) == 1);
      }
      if (round % 3 == 0) {
        assertTrue(limiter.refund(5));
        f.cancel(true);
      } else {
        f.cancel(true);
        assertTrue(limiter.refund(5));
      }
      RateDecision got = null;
      if (!f.isCancelled()) {
        got = f.get(10, TimeUnit.SECONDS);
      }
      String where = "round " + round + " (" + got + ")";
      if (got != null && got.allowed()) {
        assertEquals(0, remaining(limiter), where);
      } else {
        tokensBack(limiter, where);
      }
      waitUntil(where + ": nobody waits", () -> waiters(limiter) == 0);
    }
    waitUntil("no waiter left", () -> server.wardenInfo("waiting_clients") == 0);
  }

  /** Closing the Warden ends its waits in flight: the caller is answered, nothing stays queued. */
  @Test
  void closeEndsTheWaitsInFlight() throws Exception {
    Warden w = Warden.create(transport(server));
    WardenRateLimiter limiter = w.rateLimiter(key("closed"), 10, DAY).burst(1);
    assertTrue(limiter.tryAcquire(1).allowed());
    CompletableFuture<RateDecision> f = limiter.acquireAsync(1, LONG_WAIT).toCompletableFuture();
    waitUntil("the waiter", () -> waiters(limiter) == 1);
    w.close();
    try {
      RateDecision d = f.get(10, TimeUnit.SECONDS);
      assertFalse(d.allowed(), d.toString());
    } catch (ExecutionException expected) {
      // The connection closed under the wait.
    }
    waitUntil("no waiter left", () -> server.wardenInfo("waiting_clients") == 0);
  }

  /**
   * A Warden closed while an abort still asks {@code CLIENT UNBLOCK} again (the wait reached the
   * server but has not run: writes are paused) leaves no waiter queued once the server runs it.
   */
  @Test
  void closingWhileAnAbortAsksAgainLeavesNoWaiter() throws Exception {
    RecordingTransport rec = new RecordingTransport(transport(server));
    rec.beforeWait(() -> server.call("CLIENT", "PAUSE", "20000", "WRITE"));
    try {
      Warden w = Warden.create(rec);
      WardenRateLimiter limiter = w.rateLimiter(key("closing"), 10, DAY).burst(1);
      assertTrue(limiter.tryAcquire(1).allowed());
      CompletableFuture<RateDecision> f = limiter.acquireAsync(1, LONG_WAIT).toCompletableFuture();
      waitUntil("the wait is sent", () -> rec.waits().size() == 1);
      f.cancel(true);
      sleep(50); // CLIENT UNBLOCK finds no waiter yet, and is asked again every 2 ms
      w.close();
    } finally {
      server.call("CLIENT", "UNPAUSE");
    }
    waitUntil("no waiter left", () -> server.wardenInfo("waiting_clients") == 0);
  }

  @Test
  void randomInterruptsTimeoutsAndCancelsNeverAdmitMoreThanTheRate() throws Exception {
    int total = Math.max(200, Integer.getInteger("warden.attack.rounds", 2000) / 4);
    // 200 a second, 10 at once: a token every 5 ms, for 8 callers asking all the time.
    WardenRateLimiter limiter =
        warden.rateLimiter(key("storm"), 200, Duration.ofSeconds(1)).burst(10);
    AtomicInteger left = new AtomicInteger(total);
    AtomicInteger allowed = new AtomicInteger();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    List<Thread> workers = new ArrayList<>();
    long start = System.nanoTime();
    for (int i = 0; i < 8; i++) {
      final int id = i;
      Thread w =
          new Thread(
              () -> {
                Random r = new Random(id);
                while (left.getAndDecrement() > 0 && failure.get() == null) {
                  try {
                    Duration wait = Duration.ofMillis(r.nextInt(30));
                    RateDecision d;
                    if (r.nextInt(4) == 0) {
                      CompletableFuture<RateDecision> f =
                          limiter.acquireAsync(1, wait).toCompletableFuture();
                      if (r.nextBoolean()) {
                        f.cancel(true);
                      }
                      try {
                        d = f.isCancelled() ? null : f.get();
                      } catch (InterruptedException e) {
                        f.cancel(true);
                        throw e;
                      }
                    } else {
                      d = limiter.acquire(1, wait);
                    }
                    if (d != null && d.allowed()) {
                      allowed.incrementAndGet();
                    }
                  } catch (InterruptedException | CancellationException e) {
                    // expected: the interrupter, a cancel
                  } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof InterruptedException)) {
                      failure.compareAndSet(null, e);
                    }
                  } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                  }
                  Thread.interrupted();
                }
              });
      workers.add(w);
      w.start();
    }
    Random r = new Random(42);
    while (workers.stream().anyMatch(Thread::isAlive)) {
      workers.get(r.nextInt(workers.size())).interrupt();
      TimeUnit.MICROSECONDS.sleep(r.nextInt(2000));
    }
    long elapsedMs = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start) + 1;
    if (failure.get() != null) {
      throw new AssertionError("a call failed", failure.get());
    }
    // Over any d ms the limiter admits at most burst + d * count / period: the callers that
    // were told "allowed" are never more.
    long bound = 10 + elapsedMs * 200 / 1000;
    assertTrue(allowed.get() <= bound, allowed + " allowed in " + elapsedMs + " ms");
    assertTrue(allowed.get() > 0);
    waitUntil("nobody waits", () -> server.wardenInfo("waiting_clients") == 0);
  }

  @Test
  void refundGivesTokensBackNeverBeyondFull() {
    WardenRateLimiter limiter = warden.rateLimiter(key("refund"), 10, DAY);
    assertEquals(7, limiter.tryAcquire(3).remaining());
    assertTrue(limiter.refund(2));
    assertEquals(9, remaining(limiter));
    assertTrue(limiter.refund(5));
    // Full again: no key, or a full bucket.
    assertTrue(limiter.info().map(i -> i.remaining() == 10).orElse(true));
    assertFalse(warden.rateLimiter(key("none"), 10, DAY).refund(1));
  }

  @Test
  void setRateChangesTheRateAndKeepsWhatIsOwed() throws Exception {
    String k = key("config");
    WardenRateLimiter limiter = warden.rateLimiter(k, 10, DAY);
    WardenRateLimiter stale = warden.rateLimiter(k, 10, DAY);
    assertTrue(limiter.tryAcquire(10).allowed());
    CompletableFuture<RateDecision> waiter = stale.acquireAsync(1, LONG_WAIT).toCompletableFuture();
    waitUntil("a waiter", () -> waiters(limiter) == 1);

    assertTrue(limiter.setRate(20, DAY, 20));
    RateInfo info = limiter.info().get();
    assertEquals(20, info.count());
    assertEquals(20, info.burst());
    assertEquals(10, info.remaining(), "the 10 tokens owed are kept");
    // The waiter stated the old rate.
    ExecutionException e =
        assertThrows(ExecutionException.class, () -> waiter.get(10, TimeUnit.SECONDS));
    assertEquals(
        "ERR the limiter's rate was changed while this request waited", e.getCause().getMessage());

    // This limiter states the new rate from now on; another made with the old one is refused.
    assertEquals(9, limiter.tryAcquire(1).remaining());
    WardenServerException refused =
        assertThrows(WardenServerException.class, () -> stale.tryAcquire(1));
    assertEquals(
        "ERR limiter rate is 20 per 86400000 ms burst 20, not 10 per 86400000 ms burst 10",
        refused.getMessage());

    assertFalse(warden.rateLimiter(key("none"), 10, DAY).setRate(5, DAY));
  }

  @Test
  void anotherRateIsTheServersError() {
    String k = key("mismatch");
    assertTrue(warden.rateLimiter(k, 10, Duration.ofSeconds(1)).tryAcquire(1).allowed());
    WardenServerException e =
        assertThrows(
            WardenServerException.class,
            () -> warden.rateLimiter(k, 5, Duration.ofSeconds(1)).tryAcquire(1));
    assertEquals(
        "ERR limiter rate is 10 per 1000 ms burst 10, not 5 per 1000 ms burst 5", e.getMessage());
    assertEquals("ERR", e.code());
    // Also for a request that would wait.
    assertThrows(
        WardenServerException.class,
        () -> warden.rateLimiter(k, 5, Duration.ofSeconds(1)).acquire(1, Duration.ofSeconds(5)));
  }

  private static final class Refusal {
    final String name;
    final Executable call;
    // null: refused by the client (IllegalArgumentException); else the server's error.
    final String serverError;

    Refusal(String name, Executable call, String serverError) {
      this.name = name;
      this.call = call;
      this.serverError = serverError;
    }
  }

  @Test
  void invalidArgumentsAreRefused() {
    String k = key("bad");
    Duration second = Duration.ofSeconds(1);
    WardenRateLimiter ok = warden.rateLimiter(k, 10, second);
    List<Refusal> cases =
        Arrays.asList(
            new Refusal("count 0", () -> warden.rateLimiter(k, 0, second), null),
            new Refusal("period 0", () -> warden.rateLimiter(k, 1, Duration.ZERO), null),
            new Refusal(
                "period -1 ms", () -> warden.rateLimiter(k, 1, Duration.ofMillis(-1)), null),
            new Refusal(
                "period 1.5 ms", () -> warden.rateLimiter(k, 1, Duration.ofNanos(1_500_000)), null),
            new Refusal("burst 0", () -> ok.burst(0), null),
            new Refusal("burst -1", () -> ok.burst(-1), null),
            new Refusal("maxQueue -1", () -> ok.maxQueue(-1), null),
            new Refusal("cost 0", () -> ok.tryAcquire(0), null),
            new Refusal("acquire cost 0", () -> ok.acquire(0, second), null),
            new Refusal("refund 0", () -> ok.refund(0), null),
            new Refusal("setRate burst 0", () -> ok.setRate(1, second, 0), null),
            new Refusal(
                "count above 10^6 per ms",
                () -> warden.rateLimiter(k, 2_000_000, Duration.ofMillis(1)).tryAcquire(1),
                "ERR invalid count: expected an integer from 1 to 1000000 per ms of the period"),
            new Refusal(
                "period above a day",
                () -> warden.rateLimiter(k, 1, DAY.plusMillis(1)).tryAcquire(1),
                "ERR invalid period: expected an integer from 1 to 86400000 (ms)"),
            new Refusal(
                "burst above 10^9",
                () -> ok.burst(2_000_000_000L).tryAcquire(1),
                "ERR invalid BURST: expected an integer from 1 to 1000000000"),
            new Refusal(
                "cost above the burst",
                () -> ok.tryAcquire(11),
                "ERR invalid COST: expected an integer from 1 to the burst"),
            new Refusal(
                "a waiting cost above the burst",
                () -> ok.acquire(11, second),
                "ERR invalid COST: expected an integer from 1 to the burst"),
            new Refusal(
                "refund above 10^9",
                () -> ok.refund(2_000_000_000L),
                "ERR invalid cost: expected an integer from 1 to 1000000000"),
            new Refusal(
                "setRate count above 10^6 per ms",
                () -> ok.setRate(2_000_000, Duration.ofMillis(1)),
                "ERR invalid count: expected an integer from 1 to 1000000 per ms of the period"));
    for (Refusal c : cases) {
      if (c.serverError == null) {
        assertThrows(IllegalArgumentException.class, c.call, c.name);
      } else {
        WardenServerException e = assertThrows(WardenServerException.class, c.call, c.name);
        assertEquals(c.serverError, e.getMessage(), c.name);
      }
    }
    assertEquals(0L, server.call("EXISTS", k));
  }

  @Test
  void maxQueueShedsAtOnce() throws Exception {
    WardenRateLimiter limiter = empty("shed", 1);
    CompletableFuture<RateDecision> waiting =
        limiter.acquireAsync(1, LONG_WAIT).toCompletableFuture();
    waitUntil("a waiter", () -> waiters(limiter) == 1);
    long shedBefore = server.wardenInfo("shed");
    RateDecision shed =
        limiter
            .maxQueue(1)
            .acquireAsync(1, LONG_WAIT)
            .toCompletableFuture()
            .get(10, TimeUnit.SECONDS);
    assertFalse(shed.allowed(), shed.toString());
    assertTrue(shed.retryAfter().compareTo(Duration.ZERO) > 0, shed.toString());
    assertEquals(shedBefore + 1, server.wardenInfo("shed"));
    assertEquals(1, waiters(limiter));
    // QUEUE 2: one waits, so the next queues.
    CompletableFuture<RateDecision> queued =
        limiter.maxQueue(2).acquireAsync(1, LONG_WAIT).toCompletableFuture();
    waitUntil("a second waiter", () -> waiters(limiter) == 2);
    queued.cancel(true);
    waiting.cancel(true);
    waitUntil("nobody waits", () -> waiters(limiter) == 0);
    assertEquals(0, remaining(limiter));
  }

  @Test
  void wrongTypeStaysWrongType() {
    String k = key("string");
    server.call("SET", k, "v");
    WardenServerException e =
        assertThrows(
            WardenServerException.class, () -> warden.rateLimiter(k, 10, DAY).tryAcquire(1));
    assertEquals("WRONGTYPE", e.code());
  }
}
