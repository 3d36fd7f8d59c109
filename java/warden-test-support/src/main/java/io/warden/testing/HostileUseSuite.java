package io.warden.testing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.warden.DistributedLock;
import io.warden.DistributedReadWriteLock;
import io.warden.DistributedSemaphore;
import io.warden.Permit;
import io.warden.Warden;
import io.warden.WardenException;
import io.warden.WardenLock;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.Test;

/**
 * The client used as a careless or hostile caller would: interrupts at every point of an acquire,
 * many random interrupts and timeouts, re-entry after a lost lease, odd arguments. Each test checks
 * the server afterwards: nothing held, nobody waiting, no acquire sent twice.
 */
public abstract class HostileUseSuite extends TransportSuite {
  /** How many virtual threads go through the lock and the semaphore at once. */
  protected int virtualThreads() {
    return 10_000;
  }

  /** Nobody waiting anywhere and nothing held on {@code keys}, within a few seconds. */
  protected void assertNothingLeft(String... keys) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (System.nanoTime() < end && (server.wardenInfo("waiting_clients") != 0 || held(keys))) {
      sleep(5);
    }
    assertEquals(0, server.wardenInfo("waiting_clients"), "clients still waiting");
    for (String k : keys) {
      assertEquals(0L, server.call("EXISTS", k), k + " still held");
    }
  }

  private boolean held(String... keys) {
    for (String k : keys) {
      if (!Long.valueOf(0).equals(server.call("EXISTS", k))) {
        return true;
      }
    }
    return false;
  }

  /** {@code calls=} of one command in INFO commandstats (0 when never called). */
  protected long calls(String command) {
    Matcher m =
        Pattern.compile("(?mi)^cmdstat_" + Pattern.quote(command) + ":calls=(\\d+)")
            .matcher(server.info("commandstats"));
    return m.find() ? Long.parseLong(m.group(1)) : 0;
  }

  // ---- the Lock facade ----

  @Test
  void reentryAfterTheLeaseEndedDoesNotClaimALockAnotherHolds() throws Exception {
    String k = key("expired");
    DistributedLock lock = warden.getLock(k);
    assertTrue(lock.tryLock(0, 100, TimeUnit.MILLISECONDS));
    sleep(300);
    // The lease ended: someone else takes the lock.
    assertEquals(0L, server.call("EXISTS", k));
    assertTrue(server.call("LOCK.ACQUIRE", k, "other", "30000") != null, "the lock is free");
    // Re-entering must not report a lock the thread no longer has.
    assertFalse(lock.tryLock(), "tryLock() re-entered a lock someone else holds");
    assertFalse(lock.isHeldByCurrentThread());
    server.call("LOCK.RELEASE", k, "other");
    // With the lock free again, the thread takes it afresh and can release it.
    assertTrue(lock.tryLock());
    assertEquals(1, lock.getHoldCount());
    lock.unlock();
    assertNothingLeft(k);
  }

  /** RWLOCK.INFO's mode and total holds, as "mode/holds" ("none" when free). */
  private String rwState(String k) {
    Object info = server.call("RWLOCK.INFO", k);
    if (info == null) {
      return "none";
    }
    List<?> fields = (List<?>) info;
    String mode = null;
    Object holds = null;
    for (int i = 0; i + 1 < fields.size(); i += 2) {
      String name = new String((byte[]) fields.get(i), StandardCharsets.UTF_8);
      if (name.equals("mode")) {
        mode = new String((byte[]) fields.get(i + 1), StandardCharsets.UTF_8);
      } else if (name.equals("holds")) {
        holds = fields.get(i + 1);
      }
    }
    return mode + "/" + holds;
  }

  @Test
  void aDowngradedWriterKeepsItsWriteHold() throws Exception {
    // A read taken while writing, let go first (nested blocks) or given back (not granted
    // in time), ends the read hold only (RWLOCK.UNLOCK key owner READ): the write hold stays,
    // and no other reader gets in beside the writer.
    String[] cases = {"read-released-first", "read-given-back"};
    for (String c : cases) {
      String k = key("downgrade-" + c);
      DistributedReadWriteLock rw = warden.getReadWriteLock(k);
      rw.writeLock().lock();
      try {
        if (c.equals("read-released-first")) {
          rw.readLock().lock();
          rw.readLock().unlock();
        } else {
          for (int i = 0; i < 50; i++) {
            if (rw.readLock().tryLock(1, TimeUnit.MICROSECONDS)) {
              rw.readLock().unlock();
            }
          }
          sleep(100); // a give-back in flight
        }
        assertEquals("write/1", rwState(k), c);
        assertTrue(rw.writeLock().isHeldByCurrentThread(), c);
        assertNull(server.call("RWLOCK.READ", k, "other", "30000"), c);
      } finally {
        rw.writeLock().unlock();
      }
      assertNothingLeft(k);
    }
  }

  @Test
  void aModuleBeforeTheUnlockModeGetsReleasesWithoutIt() throws Exception {
    // Before 1.1.0 RWLOCK.UNLOCK takes no mode: the Warden learns it from the refusal and sends
    // the form without, for reads and writes alike.
    RedisServer old = RedisServer.startPreviousRelease();
    Assumptions.assumeTrue(old != null, "WARDEN_PREV_MODULE: the release before 1.1.0");
    try (Warden w = Warden.create(transport(old))) {
      DistributedReadWriteLock rw = w.getReadWriteLock("old");
      for (int round = 0; round < 2; round++) {
        rw.readLock().lock();
        assertNull(old.call("RWLOCK.WRITE", "old", "other", "30000"), "a writer beside a reader");
        rw.readLock().unlock();
        assertEquals(0L, old.call("EXISTS", "old"), "a read released without the mode");
        rw.writeLock().lock();
        assertNull(old.call("RWLOCK.READ", "old", "other", "30000"), "a reader beside the writer");
        rw.writeLock().unlock();
        assertEquals(0L, old.call("EXISTS", "old"), "a write released without the mode");
      }
    } finally {
      old.close();
    }
  }

  @Test
  void lockWithANegativeLeaseIsTheWatchdogAsInRedisson() throws Exception {
    // RLock.lock(-1, unit) and tryLock(wait, -1, unit) mean "no lease: the watchdog renews".
    String k = key("minus-one");
    DistributedLock lock = warden.getLock(k);
    lock.lock(-1, TimeUnit.SECONDS);
    try {
      sleep(200);
      assertTrue(lock.isHeldByCurrentThread(), "lock(-1, SECONDS) took a 1 ms lease");
      assertEquals(1L, server.call("EXISTS", k));
    } finally {
      lock.unlock();
    }
    assertNothingLeft(k);
  }

  @Test
  void tryLockTakesAFreeLockWhateverTheInterruptFlag() throws Exception {
    // Lock.tryLock() "acquires the lock if it is free at the time of invocation"; it is not an
    // interruptible method, and the flag stays as it was.
    String k = key("flag");
    DistributedLock lock = warden.getLock(k);
    Thread.currentThread().interrupt();
    boolean got;
    try {
      got = lock.tryLock();
    } finally {
      assertTrue(Thread.interrupted(), "the interrupt flag was lost");
    }
    assertTrue(got, "tryLock() refused a free lock because the thread was interrupted");
    lock.unlock();
    assertNothingLeft(k);
  }

  @Test
  void unlockFromAnotherThreadIsRefusedAndTheHandleApiReleasesAnywhere() throws Exception {
    String k = key("other-thread");
    DistributedLock lock = warden.getLock(k);
    lock.lock(10, TimeUnit.SECONDS);
    AtomicReference<Throwable> seen = new AtomicReference<>();
    Thread t = new Thread(() -> seen.set(catching(lock::unlock)));
    t.start();
    t.join();
    assertTrue(seen.get() instanceof IllegalMonitorStateException, String.valueOf(seen.get()));
    assertEquals(1L, server.call("EXISTS", k));
    lock.unlock();
    assertNothingLeft(k);
  }

  private static Throwable catching(Runnable r) {
    try {
      r.run();
      return null;
    } catch (Throwable e) {
      return e;
    }
  }

  // ---- interrupts at every point of an acquire ----

  /** Where the interrupt lands. */
  private enum When {
    BEFORE_THE_CALL,
    AT_ONCE,
    AFTER_1_MS,
    WHILE_BLOCKED,
    WITH_THE_GRANT,
    AFTER_THE_GRANT
  }

  private interface Acquire {
    Object call(Warden w, String k) throws InterruptedException;
  }

  /** Each way to wait: what the call returns when granted (a hold, or true for the facade). */
  private static List<Object[]> acquires() {
    Duration lease = Duration.ofSeconds(30);
    return Arrays.asList(
        new Object[] {"lock.acquire", (Acquire) (w, k) -> w.lock(k).lease(lease).acquire()},
        new Object[] {
          "lock.tryAcquire",
          (Acquire) (w, k) -> w.lock(k).lease(lease).tryAcquire(Duration.ofSeconds(20)).orElse(null)
        },
        new Object[] {
          "watchdog.tryAcquire",
          (Acquire) (w, k) -> w.lock(k).tryAcquire(Duration.ofSeconds(20)).orElse(null)
        },
        new Object[] {
          "facade.lockInterruptibly",
          (Acquire)
              (w, k) -> {
                w.getLock(k).lockInterruptibly();
                return w.getLock(k);
              }
        },
        new Object[] {
          "facade.tryLock",
          (Acquire) (w, k) -> w.getLock(k).tryLock(20, 30, TimeUnit.SECONDS) ? w.getLock(k) : null
        },
        new Object[] {
          "semaphore.acquire", (Acquire) (w, k) -> w.getSemaphore(k, 1).acquire(1, lease)
        },
        new Object[] {
          "semaphore.tryAcquire",
          (Acquire)
              (w, k) ->
                  w.getSemaphore(k, 1).tryAcquire(1, Duration.ofSeconds(20), lease).orElse(null)
        },
        new Object[] {
          "write.tryAcquire",
          (Acquire)
              (w, k) ->
                  w.getReadWriteLock(k)
                      .write()
                      .lease(lease)
                      .tryAcquire(Duration.ofSeconds(20))
                      .orElse(null)
        });
  }

  /** Takes {@code k} as another client would, for the kind {@code name} waits on. */
  private void holdAsOther(String name, String k) {
    if (name.startsWith("semaphore")) {
      server.call("SEM.ACQUIRE", k, "other", "30000", "LIMIT", "1");
    } else if (name.startsWith("write")) {
      server.call("RWLOCK.WRITE", k, "other", "30000");
    } else {
      server.call("LOCK.ACQUIRE", k, "other", "30000");
    }
  }

  private void releaseAsOther(String name, String k) {
    if (name.startsWith("semaphore")) {
      server.call("SEM.RELEASE", k, "other");
    } else if (name.startsWith("write")) {
      server.call("RWLOCK.UNLOCK", k, "other");
    } else {
      server.call("LOCK.RELEASE", k, "other");
    }
  }

  private static void giveUp(Object got) throws Exception {
    if (got instanceof DistributedLock) {
      ((DistributedLock) got).unlock();
    } else if (got instanceof AutoCloseable) {
      ((AutoCloseable) got).close();
    }
  }

  @Test
  void anInterruptAnywhereInAnAcquireLeavesNothing() throws Exception {
    for (Object[] a : acquires()) {
      String name = (String) a[0];
      Acquire acquire = (Acquire) a[1];
      for (When when : When.values()) {
        for (int round = 0; round < 3; round++) {
          String k = key(name + ":" + when + ":" + round);
          String label = name + " " + when + " round " + round;
          boolean busy = when != When.AFTER_THE_GRANT;
          if (busy) {
            holdAsOther(name, k);
          }
          AtomicReference<Object> outcome = new AtomicReference<>();
          AtomicReference<Boolean> flagAfter = new AtomicReference<>();
          CountDownLatch ready = new CountDownLatch(1);
          CountDownLatch go = new CountDownLatch(1);
          Thread t =
              new Thread(
                  () -> {
                    ready.countDown();
                    try {
                      go.await();
                    } catch (InterruptedException e) {
                      // an interrupt this early: the call starts interrupted
                      Thread.currentThread().interrupt();
                    }
                    if (when == When.BEFORE_THE_CALL) {
                      Thread.currentThread().interrupt();
                    }
                    try {
                      Object got = acquire.call(warden, k);
                      outcome.set(got == null ? "timeout" : got);
                    } catch (InterruptedException e) {
                      outcome.set("interrupted");
                    } catch (Throwable e) {
                      outcome.set(e);
                    }
                    flagAfter.set(Thread.currentThread().isInterrupted());
                    if (outcome.get() instanceof DistributedLock) {
                      // The facade's hold belongs to this thread: give it up here.
                      Thread.interrupted();
                      ((DistributedLock) outcome.get()).unlock();
                    }
                  });
          t.start();
          ready.await();
          go.countDown();
          switch (when) {
            case AFTER_1_MS:
              sleep(1);
              break;
            case WHILE_BLOCKED:
              waitUntilWaiting(1);
              break;
            case WITH_THE_GRANT:
              waitUntilWaiting(1);
              releaseAsOther(name, k);
              break;
            case AFTER_THE_GRANT:
              sleep(50);
              break;
            default:
              break;
          }
          if (when != When.BEFORE_THE_CALL) {
            t.interrupt();
          }
          t.join(20_000);
          assertFalse(t.isAlive(), label + ": still waiting");
          if (busy && when != When.WITH_THE_GRANT) {
            releaseAsOther(name, k);
          }
          Object o = outcome.get();
          if ("interrupted".equals(o)) {
            assertFalse(flagAfter.get(), label + ": InterruptedException left the flag set");
          } else if (o instanceof AutoCloseable || o instanceof DistributedLock) {
            // The grant came first: the call returns it and the interrupt stays pending.
            // (The interrupt may also land after the call returned: no flag to check then.)
            if (when == When.BEFORE_THE_CALL) {
              assertTrue(flagAfter.get(), label + ": a grant returned with the flag cleared");
            }
            if (!(o instanceof DistributedLock)) {
              giveUp(o);
            }
          } else {
            throw new AssertionError(label + ": " + o);
          }
          assertNothingLeft(k);
        }
      }
    }
  }

  private void waitUntilWaiting(long n) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (server.wardenInfo("waiting_clients") < n && System.nanoTime() < end) {
      Thread.yield();
    }
  }

  // ---- many random interrupts, timeouts and cancels ----

  @Test
  void randomInterruptsTimeoutsAndCancelsLeaveNothingAndSendNoAcquireTwice() throws Exception {
    int total = Integer.getInteger("warden.attack.rounds", 2000);
    String k = key("storm");
    String s = key("storm-sem");
    long acquiresBefore = calls("lock.acquire") + calls("sem.acquire");
    AtomicInteger issued = new AtomicInteger();
    AtomicInteger granted = new AtomicInteger();
    AtomicInteger inside = new AtomicInteger();
    AtomicInteger maxInside = new AtomicInteger();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    int threads = 16;
    List<Thread> workers = new ArrayList<>();
    AtomicInteger left = new AtomicInteger(total);
    for (int i = 0; i < threads; i++) {
      final int id = i;
      Thread w =
          new Thread(
              () -> {
                Random r = new Random(id);
                while (left.getAndDecrement() > 0 && failure.get() == null) {
                  try {
                    issued.incrementAndGet();
                    boolean sem = r.nextInt(3) == 0;
                    Duration wait = Duration.ofMillis(r.nextInt(30));
                    Object got =
                        sem
                            ? warden
                                .getSemaphore(s, 2)
                                .tryAcquire(1, wait, Duration.ofSeconds(10))
                                .orElse(null)
                            : warden
                                .lock(k)
                                .lease(Duration.ofSeconds(10))
                                .tryAcquire(wait)
                                .orElse(null);
                    if (got != null) {
                      granted.incrementAndGet();
                      if (!sem) {
                        int n = inside.incrementAndGet();
                        maxInside.accumulateAndGet(n, Math::max);
                        if (r.nextBoolean()) {
                          try {
                            Thread.sleep(r.nextInt(3));
                          } catch (InterruptedException e) {
                            // the interrupter again
                          }
                        }
                        inside.decrementAndGet();
                      }
                      ((AutoCloseable) got).close();
                    }
                  } catch (InterruptedException e) {
                    // expected: the interrupter
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
      workers.get(r.nextInt(threads)).interrupt();
      TimeUnit.MICROSECONDS.sleep(r.nextInt(2000));
    }
    if (failure.get() != null) {
      throw new AssertionError("a call failed", failure.get());
    }
    assertEquals(1, maxInside.get(), "two holders at once");
    assertNothingLeft(k, s);
    long sent = calls("lock.acquire") + calls("sem.acquire") - acquiresBefore;
    // Each call sends its fast path and at most one wait: never more.
    assertTrue(sent <= 2L * issued.get(), "acquires sent " + sent + " for " + issued + " calls");
    System.out.printf(
        "%s: %d calls, %d granted, %d acquires sent%n",
        getClass().getSimpleName(), issued.get(), granted.get(), sent);
  }

  // ---- virtual threads ----

  private static Method startVirtual() {
    try {
      return Thread.class.getMethod("startVirtualThread", Runnable.class);
    } catch (NoSuchMethodException e) {
      return null;
    }
  }

  @Test
  void tenThousandVirtualThreadsThroughLockAndSemaphore() throws Exception {
    Method start = startVirtual();
    org.junit.jupiter.api.Assumptions.assumeTrue(start != null, "virtual threads: Java 21+");
    int n = Integer.getInteger("warden.attack.virtual", virtualThreads());
    String k = key("vt");
    String s = key("vt-sem");
    AtomicInteger inside = new AtomicInteger();
    AtomicInteger max = new AtomicInteger();
    AtomicInteger semInside = new AtomicInteger();
    AtomicInteger semMax = new AtomicInteger();
    AtomicInteger done = new AtomicInteger();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    DistributedSemaphore sem = warden.getSemaphore(s, 4);
    List<Thread> all = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      final int id = i;
      Runnable body =
          () -> {
            try {
              if (id % 2 == 0) {
                try (WardenLock h = warden.lock(k).lease(Duration.ofSeconds(30)).acquire()) {
                  max.accumulateAndGet(inside.incrementAndGet(), Math::max);
                  inside.decrementAndGet();
                  assertTrue(h.fence() > 0);
                }
              } else {
                try (Permit p = sem.acquire(1, Duration.ofSeconds(30))) {
                  semMax.accumulateAndGet(semInside.incrementAndGet(), Math::max);
                  semInside.decrementAndGet();
                  assertEquals(1, p.permits());
                }
              }
              done.incrementAndGet();
            } catch (Throwable e) {
              failure.compareAndSet(null, e);
            }
          };
      all.add((Thread) start.invoke(null, body));
    }
    for (Thread t : all) {
      t.join(300_000);
      assertFalse(t.isAlive(), "a virtual thread did not finish");
    }
    if (failure.get() != null) {
      throw new AssertionError("a virtual thread failed", failure.get());
    }
    assertEquals(n, done.get());
    assertEquals(1, max.get());
    assertTrue(semMax.get() <= 4, "semaphore over its limit: " + semMax.get());
    assertNothingLeft(k, s);
  }

  // ---- careless arguments ----

  @Test
  void aLoaderThatReturnsNullCachesNothing() throws Exception {
    String k = key("null-value");
    byte[] first = warden.cache().getOrLoad(k, Duration.ofSeconds(10), () -> null);
    assertNull(first);
    // Nothing cached: the next caller loads (it must not read the text "null").
    byte[] second =
        warden
            .cache()
            .getOrLoad(k, Duration.ofSeconds(10), () -> "v".getBytes(StandardCharsets.UTF_8));
    assertArrayEquals("v".getBytes(StandardCharsets.UTF_8), second);
  }

  @Test
  void zeroAndNegativeLeasesAreRefused() {
    String k = key("lease");
    for (Duration d : Arrays.asList(Duration.ZERO, Duration.ofMillis(-5))) {
      assertThrows(IllegalArgumentException.class, () -> warden.lock(k).lease(d), d.toString());
      assertThrows(
          IllegalArgumentException.class,
          () -> warden.getSemaphore(k, 2).tryAcquire(1, Duration.ZERO, d),
          d.toString());
    }
    assertNothingLeft(k);
  }

  @Test
  void extendWithAZeroOrNegativeLeaseIsRefusedAndKeepsTheHold() throws Exception {
    String k = key("extend");
    try (WardenLock h = warden.lock(k).lease(Duration.ofSeconds(10)).acquire()) {
      for (Duration d : Arrays.asList(Duration.ZERO, Duration.ofSeconds(-1))) {
        assertThrows(IllegalArgumentException.class, () -> h.extend(d), d.toString());
      }
      sleep(50);
      assertTrue(h.isHeld());
      assertEquals(1L, server.call("EXISTS", k));
    }
    assertNothingLeft(k);
  }

  @Test
  void oddArgumentsFailClearlyAndLeaveNothing() throws Exception {
    String k = key("odd");
    // Null key: a clear exception, not a lock on the key "null".
    assertThrows(NullPointerException.class, () -> warden.lock(null));
    assertThrows(NullPointerException.class, () -> warden.getLock(null));
    assertThrows(NullPointerException.class, () -> warden.getSemaphore(null, 1));
    assertThrows(NullPointerException.class, () -> warden.getReadWriteLock(null));
    assertThrows(
        NullPointerException.class,
        () -> warden.cache().getOrLoadString(null, Duration.ofSeconds(1), () -> "v"));
    assertEquals(0L, server.call("EXISTS", "null"));
    // Empty key: the server takes it as a key like any other.
    Optional<WardenLock> empty =
        warden.lock("").lease(Duration.ofSeconds(5)).tryAcquire(Duration.ZERO);
    assertTrue(empty.isPresent());
    empty.get().release();
    assertEquals(0L, server.call("EXISTS", ""));
    // Permits over the limit or under 1.
    assertThrows(
        IllegalArgumentException.class,
        () -> warden.getSemaphore(k, 2).tryAcquire(3, Duration.ZERO, Duration.ofSeconds(1)));
    assertThrows(
        IllegalArgumentException.class,
        () -> warden.getSemaphore(k, 2).tryAcquire(0, Duration.ZERO, Duration.ofSeconds(1)));
    assertThrows(IllegalArgumentException.class, () -> warden.getSemaphore(k, 0));
    // A huge wait is a wait without end in practice; a huge lease is clamped or refused clearly.
    Optional<WardenLock> huge =
        warden.lock(k).lease(Duration.ofDays(365)).tryAcquire(Duration.ofSeconds(Long.MAX_VALUE));
    assertTrue(huge.isPresent());
    assertTrue(huge.get().isHeld());
    huge.get().release();
    // Release twice, close twice.
    huge.get().release();
    huge.get().close();
    assertNothingLeft(k);
  }

  @Test
  void aSemaphoreLimitChangeIsVisible() throws Exception {
    String k = key("limit");
    Permit a = warden.getSemaphore(k, 3).acquire(2, Duration.ofSeconds(10));
    // Another process says the limit is 1 now: the server keeps one limit per key.
    Object r;
    try {
      r = warden.getSemaphore(k, 1).tryAcquire(1, Duration.ZERO, Duration.ofSeconds(10));
    } catch (RuntimeException e) {
      r = e;
    }
    System.out.println(getClass().getSimpleName() + " limit change: " + r);
    if (r instanceof Optional && ((Optional<?>) r).isPresent()) {
      ((Permit) ((Optional<?>) r).get()).release();
    }
    a.release();
    assertNothingLeft(k);
  }

  @Test
  void useAfterCloseFailsClearly() throws Exception {
    String k = key("closed");
    WardenLock h = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
    warden.close();
    warden.close();
    Throwable e = catching(() -> uncheckedAcquire(k));
    assertTrue(
        e instanceof WardenException && e.getMessage().contains("closed"), String.valueOf(e));
    // Nothing starts on a closed Warden, whatever its transport: a transport kept open (its owner
    // closes it) would otherwise take a hold this Warden's watchdog never renews.
    io.warden.Transport open = transport(server);
    Warden kept = Warden.builder(open).closeTransport(false).build();
    kept.close();
    Throwable k2 =
        catching(
            () -> {
              try {
                kept.lock(k + ":kept").acquire();
              } catch (InterruptedException ie) {
                throw new AssertionError(ie);
              }
            });
    open.close();
    assertTrue(k2 instanceof WardenException, String.valueOf(k2));
    assertEquals(0L, server.call("EXISTS", k + ":kept"));
    System.out.println(getClass().getSimpleName() + " after close: " + e);
    // The hold taken before the close: its release says what happened (the transport is gone).
    Throwable r = catching(h::release);
    System.out.println(getClass().getSimpleName() + " release after close: " + r);
    server.call("DEL", k);
    warden = Warden.create(transport(server));
  }

  private void uncheckedAcquire(String k) {
    try {
      warden.lock(k).lease(Duration.ofSeconds(1)).tryAcquire(Duration.ofMillis(100));
    } catch (InterruptedException e) {
      throw new AssertionError(e);
    }
  }

  // ---- connections dropped under a wait ----

  /** The id of the client blocked in {@code cmd}, or -1. */
  private long clientRunning(String cmd) {
    Object list = server.call("CLIENT", "LIST");
    String text =
        list instanceof byte[] ? new String((byte[]) list, StandardCharsets.UTF_8) : "" + list;
    for (String line : text.split("\n")) {
      if (line.contains(" flags=b ") && line.contains(" cmd=" + cmd + " ")) {
        Matcher m = Pattern.compile("id=(\\d+)").matcher(line);
        if (m.find()) {
          return Long.parseLong(m.group(1));
        }
      }
    }
    return -1;
  }

  @Test
  void aWaiterConnectionKilledMidWaitEndsTheCallAndIsNeverResent() throws Exception {
    String k = key("killed");
    server.call("LOCK.ACQUIRE", k, "other", "30000");
    long before = calls("lock.acquire");
    AtomicReference<Object> outcome = new AtomicReference<>();
    Thread t =
        new Thread(
            () -> {
              try {
                Optional<WardenLock> got =
                    warden.lock(k).lease(Duration.ofSeconds(30)).tryAcquire(Duration.ofSeconds(8));
                outcome.set(got.isPresent() ? got.get() : "timeout");
              } catch (Throwable e) {
                outcome.set(e);
              }
            });
    t.start();
    waitUntilWaiting(1);
    long id = clientRunning("lock.acquire");
    assertTrue(id > 0, "no waiter in CLIENT LIST");
    long killed = System.nanoTime();
    server.call("CLIENT", "KILL", "ID", Long.toString(id));
    t.join(20_000);
    assertFalse(t.isAlive());
    System.out.println(
        getClass().getSimpleName()
            + " waiter killed: "
            + outcome.get()
            + " after "
            + TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - killed)
            + " ms");
    // The holder leaves: a re-sent wait would be granted now.
    server.call("LOCK.RELEASE", k, "other");
    sleep(300);
    // The fast path and the wait (a server may count a killed wait or not): never a third.
    long sent = calls("lock.acquire") - before;
    assertTrue(sent <= 2, "the wait was sent again: " + sent + " LOCK.ACQUIRE");
    if (outcome.get() instanceof Throwable) {
      // A lost connection says so (not an exception with the message "null").
      assertFalse("null".equals(((Throwable) outcome.get()).getMessage()), "" + outcome.get());
    }
    if (outcome.get() instanceof WardenLock) {
      ((WardenLock) outcome.get()).release();
    }
    assertNothingLeft(k);
  }

  @Test
  void aWatchdogHoldLostInARestartSaysSo() throws Exception {
    String k = key("restart");
    WardenLock h =
        warden.lock(k).watchdog(Duration.ofMillis(600)).tryAcquire(Duration.ZERO).orElse(null);
    assertTrue(h != null);
    CountDownLatch lost = new CountDownLatch(1);
    h.onLost(lost::countDown);
    server.restart();
    // Without persistence the lock is gone: the next renewal is refused (or fails until the
    // lease ends), and the hold says so.
    assertTrue(lost.await(10, TimeUnit.SECONDS), "onLost never ran");
    assertFalse(h.isHeld());
    assertFalse(h.extend(Duration.ofSeconds(1)));
    h.release();
    // The client works again after the restart.
    Optional<WardenLock> again =
        warden.lock(k).lease(Duration.ofSeconds(5)).tryAcquire(Duration.ofSeconds(5));
    assertTrue(again.isPresent());
    again.get().release();
    assertNothingLeft(k);
  }
}
