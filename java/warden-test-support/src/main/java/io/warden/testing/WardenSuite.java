package io.warden.testing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.warden.DistributedLock;
import io.warden.DistributedReadWriteLock;
import io.warden.DistributedSemaphore;
import io.warden.LockRequest;
import io.warden.Permit;
import io.warden.Transport;
import io.warden.Warden;
import io.warden.WardenCache;
import io.warden.WardenLock;
import io.warden.WardenNotLoadedException;
import io.warden.WardenServerException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Function;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/**
 * The behaviour of warden's Java client, run against real servers through one transport (each
 * transport module runs it). Behaviour only: no assertion on speed.
 */
public abstract class WardenSuite extends TransportSuite {

  /** Nothing held and nobody waiting on {@code key}, nobody waiting anywhere. */
  protected void assertNothingLeft(String key) {
    assertNothingLeft(key, false);
  }

  /**
   * As {@link #assertNothingLeft(String)}; {@code eventually}: after a cancel, which returns before
   * the abort is done, within a few seconds.
   */
  protected void assertNothingLeft(String key, boolean eventually) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while ((server.wardenInfo("waiting_clients") != 0
            || (eventually && !Long.valueOf(0).equals(server.call("EXISTS", key))))
        && System.nanoTime() < end) {
      sleep(5);
    }
    assertEquals(0, server.wardenInfo("waiting_clients"), "clients still waiting");
    assertEquals(0L, server.call("EXISTS", key), () -> key + " still held: " + describe(key));
  }

  private String describe(String key) {
    try {
      Object type = server.call("TYPE", key);
      String kind = type instanceof byte[] ? new String((byte[]) type, StandardCharsets.UTF_8) : "";
      Object info =
          server.call(
              kind.equals("warden-rw")
                  ? "RWLOCK.INFO"
                  : kind.equals("warden-sm") ? "SEM.INFO" : "LOCK.INFO",
              key);
      StringBuilder sb = new StringBuilder();
      for (Object o : (List<?>) info) {
        sb.append(o instanceof byte[] ? new String((byte[]) o, StandardCharsets.UTF_8) : o)
            .append(' ');
      }
      return sb.toString();
    } catch (RuntimeException e) {
      return String.valueOf(server.call("TYPE", key));
    }
  }

  private static void join(List<Thread> threads) throws InterruptedException {
    for (Thread t : threads) {
      t.join(60_000);
      assertFalse(t.isAlive(), "a thread did not finish");
    }
  }

  // ---- exclusion ----

  @Test
  void locksExcludeAcrossThreads() throws Exception {
    String k = key("lock");
    AtomicInteger inside = new AtomicInteger();
    AtomicInteger max = new AtomicInteger();
    AtomicInteger done = new AtomicInteger();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    List<Thread> threads = new ArrayList<>();
    DistributedLock facade = warden.getLock(k);
    for (int t = 0; t < 8; t++) {
      boolean useFacade = t % 2 == 0;
      Thread th =
          new Thread(
              () -> {
                try {
                  for (int i = 0; i < 40; i++) {
                    WardenLock h = null;
                    if (useFacade) {
                      facade.lock(10, TimeUnit.SECONDS);
                    } else {
                      h = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
                    }
                    int n = inside.incrementAndGet();
                    max.accumulateAndGet(n, Math::max);
                    inside.decrementAndGet();
                    if (useFacade) {
                      facade.unlock();
                    } else {
                      h.release();
                    }
                    done.incrementAndGet();
                  }
                } catch (Throwable e) {
                  failure.set(e);
                }
              });
      threads.add(th);
      th.start();
    }
    join(threads);
    assertNull(failure.get());
    assertEquals(320, done.get());
    assertEquals(1, max.get());
    assertNothingLeft(k);
  }

  @Test
  void semaphoreNeverExceedsItsLimit() throws Exception {
    String k = key("sem");
    DistributedSemaphore sem = warden.getSemaphore(k, 3);
    AtomicInteger inside = new AtomicInteger();
    AtomicInteger max = new AtomicInteger();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < 8; t++) {
      int permits = t % 4 == 0 ? 2 : 1;
      Thread th =
          new Thread(
              () -> {
                try {
                  for (int i = 0; i < 25; i++) {
                    try (Permit p = sem.acquire(permits, Duration.ofSeconds(10))) {
                      int n = inside.addAndGet(permits);
                      max.accumulateAndGet(n, Math::max);
                      inside.addAndGet(-permits);
                      assertEquals(permits, p.permits());
                    }
                  }
                } catch (Throwable e) {
                  failure.set(e);
                }
              });
      threads.add(th);
      th.start();
    }
    join(threads);
    assertNull(failure.get());
    assertTrue(max.get() <= 3, "at most 3 permits inside, saw " + max.get());
    assertEquals(3, sem.availablePermits());
    assertNothingLeft(k);
  }

  @Test
  void readersShareAndWritersExclude() throws Exception {
    String k = key("rw");
    DistributedReadWriteLock rw = warden.getReadWriteLock(k);
    try (WardenLock r1 = rw.read().lease(Duration.ofSeconds(10)).acquire();
        WardenLock r2 = rw.read().lease(Duration.ofSeconds(10)).acquire()) {
      assertTrue(r2.fence() > r1.fence());
      assertFalse(rw.write().tryAcquire(Duration.ofMillis(50)).isPresent());
      assertTrue(rw.readLock().isLocked());
      assertFalse(rw.writeLock().isLocked());
    }
    // The facade: a writer may downgrade (read while writing); a reader may not upgrade.
    rw.writeLock().lock();
    rw.readLock().lock();
    assertTrue(rw.writeLock().isLocked());
    rw.writeLock().unlock();
    assertFalse(rw.writeLock().isLocked());
    assertThrows(WardenServerException.class, () -> rw.writeLock().tryLock(0, TimeUnit.SECONDS));
    rw.readLock().unlock();
    assertNothingLeft(k);
  }

  // ---- the facade ----

  @Test
  void facadeIsReentrantPerThreadAndRefusesOtherThreadsUnlock() throws Exception {
    String k = key("facade");
    DistributedLock lock = warden.getLock(k);
    lock.lock();
    lock.lock();
    assertEquals(2, lock.getHoldCount());
    assertTrue(lock.isHeldByCurrentThread());
    long fence = lock.fence();
    assertTrue(lock.remainTimeToLive() > 0);
    AtomicReference<Throwable> other = new AtomicReference<>();
    Thread t =
        new Thread(
            () -> {
              try {
                assertFalse(lock.isHeldByCurrentThread());
                assertFalse(lock.tryLock());
                lock.unlock();
              } catch (Throwable e) {
                other.set(e);
              }
            });
    t.start();
    t.join();
    assertTrue(other.get() instanceof IllegalMonitorStateException, String.valueOf(other.get()));
    assertThrows(IllegalMonitorStateException.class, () -> warden.getLock(k + "x").unlock());
    lock.unlock();
    assertTrue(lock.isLocked());
    assertEquals(fence, lock.fence());
    lock.unlock();
    assertFalse(lock.isLocked());
    assertThrows(IllegalMonitorStateException.class, lock::fence);
    assertEquals(-2, lock.remainTimeToLive());
  }

  @Test
  void handleIsReleasedFromAnotherThread() throws Exception {
    String k = key("handle");
    WardenLock h = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
    Thread t = new Thread(h::release);
    t.start();
    t.join();
    assertFalse(h.isHeld());
    h.release(); // idempotent
    assertNothingLeft(k);
  }

  @Test
  void handleIsReleasedFromAVirtualThread() throws Exception {
    Method start;
    try {
      start = Thread.class.getMethod("startVirtualThread", Runnable.class);
    } catch (NoSuchMethodException e) {
      assumeTrue(false, "virtual threads need Java 21+ (mvn -Pjdk25)");
      return;
    }
    String k = key("virtual");
    WardenLock h = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
    CountDownLatch waiting = new CountDownLatch(1);
    AtomicReference<Optional<WardenLock>> got = new AtomicReference<>();
    Thread waiter =
        (Thread)
            start.invoke(
                null,
                (Runnable)
                    () -> {
                      try {
                        waiting.countDown();
                        got.set(
                            warden
                                .lock(k)
                                .lease(Duration.ofSeconds(10))
                                .tryAcquire(Duration.ofSeconds(20)));
                      } catch (InterruptedException e) {
                        got.set(Optional.empty());
                      }
                    });
    waiting.await();
    Thread releaser = (Thread) start.invoke(null, (Runnable) h::release);
    releaser.join(20_000);
    waiter.join(20_000);
    assertTrue(got.get().isPresent());
    got.get().get().release();
    assertNothingLeft(k);
  }

  // ---- deadlines, interrupts, aborts ----

  @Test
  void tryAcquireTimesOutAndLeavesNoWaiter() throws Exception {
    String k = key("busy");
    try (WardenLock h = warden.lock(k).lease(Duration.ofSeconds(30)).acquire()) {
      assertTrue(h.isHeld());
      assertFalse(warden.lock(k).tryAcquire(Duration.ofMillis(100)).isPresent());
      assertFalse(warden.getLock(k).tryLock(50, 1000, TimeUnit.MILLISECONDS));
      assertFalse(warden.lock(k).tryAcquire(Duration.ZERO).isPresent());
      assertEquals(0, server.wardenInfo("waiting_clients"));
    }
    assertNothingLeft(k);
  }

  /**
   * A request waiting on each kind: the holder, then what the waiter calls (blocking, and async),
   * and the command the waiter's connection is blocked in.
   */
  private static final class Shape {
    final String name;
    final String command;
    final Function<Warden, AutoCloseable> hold;
    final Function<Warden, Waiter> wait;
    final Function<Warden, AsyncWaiter> waitAsync;

    Shape(
        String name,
        String command,
        Function<Warden, AutoCloseable> hold,
        Function<Warden, Waiter> wait,
        Function<Warden, AsyncWaiter> waitAsync) {
      this.name = name;
      this.command = command;
      this.hold = hold;
      this.wait = wait;
      this.waitAsync = waitAsync;
    }
  }

  private interface Waiter {
    Optional<? extends AutoCloseable> call(Duration wait) throws InterruptedException;
  }

  private interface AsyncWaiter {
    CompletableFuture<? extends Optional<? extends AutoCloseable>> call(Duration wait);
  }

  private List<Shape> shapes(String k) {
    Duration lease = Duration.ofSeconds(30);
    return Arrays.asList(
        new Shape(
            "lock",
            "lock.acquire",
            w -> uncheck(() -> w.lock(k).lease(lease).acquire()),
            w -> d -> w.lock(k).lease(lease).tryAcquire(d),
            w -> d -> w.lock(k).lease(lease).tryAcquireAsync(d).toCompletableFuture()),
        new Shape(
            "rwlock",
            "rwlock.read",
            w -> uncheck(() -> w.getReadWriteLock(k).write().lease(lease).acquire()),
            w -> d -> w.getReadWriteLock(k).read().lease(lease).tryAcquire(d),
            w ->
                d ->
                    w.getReadWriteLock(k)
                        .read()
                        .lease(lease)
                        .tryAcquireAsync(d)
                        .toCompletableFuture()),
        new Shape(
            "semaphore",
            "sem.acquire",
            w -> uncheck(() -> w.getSemaphore(k, 1).acquire(1, lease)),
            w -> d -> w.getSemaphore(k, 1).tryAcquire(1, d, lease),
            w -> d -> w.getSemaphore(k, 1).tryAcquireAsync(1, d, lease).toCompletableFuture()));
  }

  private interface Call<T> {
    T call() throws Exception;
  }

  private static <T> T uncheck(Call<T> c) {
    try {
      return c.call();
    } catch (Exception e) {
      throw new AssertionError(e);
    }
  }

  @Test
  void interruptedWaitsLeaveNoHolderAndNoWaiter() throws Exception {
    for (Shape shape : shapes(key("x"))) {
      String k = key("x");
      for (int round = 0; round < 12; round++) {
        AutoCloseable holder = shape.hold.apply(warden);
        AtomicReference<Object> outcome = new AtomicReference<>();
        CountDownLatch started = new CountDownLatch(1);
        Thread t =
            new Thread(
                () -> {
                  started.countDown();
                  try {
                    Optional<? extends AutoCloseable> got =
                        shape.wait.apply(warden).call(Duration.ofSeconds(20));
                    outcome.set(got.isPresent() ? got.get() : "timeout");
                  } catch (InterruptedException e) {
                    outcome.set("interrupted");
                  } catch (Throwable e) {
                    outcome.set(e);
                  }
                });
        t.start();
        started.await();
        // Rounds vary when the interrupt comes: before the wait is sent, while it waits, and in
        // the same instant as the release that grants it (the grant then races the abort).
        sleep(round % 4 == 0 ? 0 : round % 4 == 1 ? 2 : 20);
        if (round % 3 == 2) {
          holder.close();
          t.interrupt();
        } else {
          t.interrupt();
          t.join(20_000);
          holder.close();
        }
        t.join(20_000);
        Object o = outcome.get();
        if (o instanceof AutoCloseable) {
          // The grant won the race before the interrupt was seen: the caller has it.
          ((AutoCloseable) o).close();
        } else {
          assertEquals("interrupted", o, shape.name + " round " + round);
        }
        try {
          // Eventually: on Redis < 7.4 through Jedis, the give-back of a grant that raced the
          // interrupt has been seen to finish just after the interrupted call returned (about 1
          // run in 15 under load); it is never left to the lease.
          assertNothingLeft(k, true);
        } catch (AssertionError e) {
          String holderOwner =
              holder instanceof WardenLock
                  ? ((WardenLock) holder).owner()
                  : holder instanceof Permit ? ((Permit) holder).owner() : "?";
          throw new AssertionError(
              shape.name + " round " + round + " (" + o + ", holder " + holderOwner + "): " + e, e);
        }
      }
    }
  }

  @Test
  void cancelledAsyncWaitLeavesNothingAndARacedGrantIsGivenBack() throws Exception {
    String k = key("async");
    for (int round = 0; round < 10; round++) {
      WardenLock holder = warden.lock(k).lease(Duration.ofSeconds(30)).acquire();
      CompletableFuture<Optional<WardenLock>> f =
          warden
              .lock(k)
              .lease(Duration.ofSeconds(30))
              .tryAcquireAsync(Duration.ofSeconds(20))
              .toCompletableFuture();
      sleep(round % 2 == 0 ? 1 : 20);
      if (round % 3 == 0) {
        holder.release();
        f.cancel(true);
      } else {
        f.cancel(true);
        holder.release();
      }
      if (!f.isCancelled()) {
        f.get().ifPresent(WardenLock::release);
      }
      assertNothingLeft(k, true);
    }
    // The semaphore's async acquire, granted at once.
    DistributedSemaphore sem = warden.getSemaphore(key("s"), 2);
    Optional<Permit> p =
        sem.tryAcquireAsync(2, Duration.ofSeconds(1), Duration.ofSeconds(5))
            .toCompletableFuture()
            .get();
    assertTrue(p.isPresent());
    assertEquals(0, sem.availablePermits());
    p.get().release();
  }

  // ---- a release without a reply ----

  /** Takes a 30 s hold of {@code kind} on {@code key} through {@code w}; what releases it. */
  private static Runnable hold(Warden w, String kind, String key) throws Exception {
    Duration lease = Duration.ofSeconds(30);
    switch (kind) {
      case "lock":
        return w.lock(key).lease(lease).acquire()::release;
      case "semaphore":
        return w.getSemaphore(key, 2).acquire(1, lease)::release;
      case "write":
        return w.getReadWriteLock(key).write().lease(lease).acquire()::release;
      case "read":
        return w.getReadWriteLock(key).read().lease(lease).acquire()::release;
      case "downgrade": // a read taken under its own write: the two share an owner
        DistributedReadWriteLock rw = w.getReadWriteLock(key);
        rw.writeLock().lock(30, TimeUnit.SECONDS);
        rw.readLock().lock(30, TimeUnit.SECONDS);
        return rw.writeLock()::unlock;
      default: // the java.util.concurrent.locks.Lock facade
        DistributedLock facade = w.getLock(key);
        facade.lock(30, TimeUnit.SECONDS);
        return facade::unlock;
    }
  }

  /** The ids of the clients connected now. */
  private Set<String> clientIds() {
    Set<String> ids = new HashSet<>();
    Matcher m = Pattern.compile("(?m)^id=(\\d+) ").matcher(str(server.call("CLIENT", "LIST")));
    while (m.find()) {
      ids.add(m.group(1));
    }
    return ids;
  }

  /**
   * A release whose connection breaks before the server ran it (writes paused, then {@code CLIENT
   * KILL}): the caller gets the error, and the release is sent once more on a new connection, so
   * the key is free, not held by nobody until its lease ends. Every kind of hold, and the facade
   * (released on the thread that locked it); not for an owner another acquire named (a downgrade).
   */
  @Test
  void aReleaseCutOffBeforeItRunsIsSentAgain() throws Exception {
    for (String kind : Arrays.asList("lock", "semaphore", "write", "read", "facade", "downgrade")) {
      String k = key(kind);
      long unlocks = calls("rwlock.unlock");
      Set<String> others = clientIds();
      Warden w = Warden.create(transport(server));
      try {
        CompletableFuture<Void> held = new CompletableFuture<>();
        CountDownLatch go = new CountDownLatch(1);
        CompletableFuture<Throwable> released = new CompletableFuture<>();
        Thread t =
            new Thread(
                () -> {
                  Runnable release;
                  try {
                    release = hold(w, kind, k);
                    held.complete(null);
                    go.await();
                  } catch (Throwable e) {
                    held.completeExceptionally(e);
                    return;
                  }
                  try {
                    release.run();
                    released.complete(null);
                  } catch (Throwable e) {
                    released.complete(e);
                  }
                });
        t.start();
        held.get(30, TimeUnit.SECONDS);
        server.call("CLIENT", "PAUSE", "20000", "WRITE");
        try {
          go.countDown();
          // This Warden's connections whose last command is warden's, once one of them shows the
          // release, postponed by the pause (CLIENT KILL is no write).
          Pattern mine = Pattern.compile("(?m)^id=(\\d+) .* cmd=((lock|sem|rwlock)\\.[a-z]+) ");
          List<String> ids = new ArrayList<>();
          boolean releasing = false;
          long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
          while (!releasing && System.nanoTime() < end) {
            sleep(10);
            ids.clear();
            Matcher m = mine.matcher(str(server.call("CLIENT", "LIST")));
            while (m.find()) {
              if (!others.contains(m.group(1))) {
                ids.add(m.group(1));
                releasing |= m.group(2).matches("lock\\.release|rwlock\\.unlock|sem\\.release");
              }
            }
          }
          assertTrue(releasing, kind + ": no release postponed by the pause");
          for (String id : ids) {
            server.call("CLIENT", "KILL", "ID", id);
          }
          assertNotNull(released.get(30, TimeUnit.SECONDS), kind + ": the release did not fail");
          assertEquals(1L, server.call("EXISTS", k), kind + ": the first release ran");
          if (kind.equals("lock")) {
            // Past a blocking transport's socket timeout (Jedis: 2 s): sent again until answered.
            sleep(3_000);
          }
        } finally {
          server.call("CLIENT", "UNPAUSE");
        }
        if (kind.equals("downgrade")) {
          // The owner holds the read too: a second release could end what the first did not
          // (before 1.1.0, RWLOCK.UNLOCK without its mode). Not sent again: left to the lease.
          sleep(1_000);
          assertEquals(unlocks, calls("rwlock.unlock"), "the release was sent again");
          assertEquals(1L, server.call("EXISTS", k));
          server.call("DEL", k);
          t.join(10_000);
          continue;
        }
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (!Long.valueOf(0).equals(server.call("EXISTS", k)) && System.nanoTime() < end) {
          sleep(10);
        }
        assertEquals(0L, server.call("EXISTS", k), () -> kind + " still held: " + describe(k));
        t.join(10_000);
      } finally {
        w.close();
      }
    }
  }

  /**
   * What docs/clients/java.md says of a hold still held at {@code close()}: not released by it, not
   * releasable after it (the transport is closed); its lease ends it.
   */
  @Test
  void aHoldStillHeldAtCloseIsLeftToItsLease() throws Exception {
    String k = key("held-through-close");
    Warden w = Warden.create(transport(server));
    WardenLock h = w.lock(k).lease(Duration.ofSeconds(30)).acquire();
    w.close();
    assertEquals(1L, server.call("EXISTS", k), "close() released the hold");
    assertThrows(RuntimeException.class, h::release);
    assertEquals(1L, server.call("EXISTS", k));
    server.call("DEL", k);
  }

  // ---- an abort's take-out: WARDEN.WITHDRAW, else CLIENT UNBLOCK, else closing ----

  /** A transport to {@code server} logged in as the ACL user {@code user}. */
  protected abstract Transport transport(RedisServer server, String user, String password);

  /** How a caller abandons a wait. */
  private enum Abandon {
    INTERRUPT,
    CANCEL
  }

  /** The id of the client blocked in {@code command} (lower case), or -1. */
  private long blockedIn(String command) {
    for (String line : str(server.call("CLIENT", "LIST")).split("\n")) {
      if (line.contains(" flags=b ") && line.contains(" cmd=" + command + " ")) {
        Matcher m = Pattern.compile("^id=(\\d+) ").matcher(line);
        if (m.find()) {
          return Long.parseLong(m.group(1));
        }
      }
    }
    return -1;
  }

  /** Whether the server lists client {@code id}, once it had time to see a close. */
  private boolean stillConnected(long id) {
    sleep(100);
    return str(server.call("CLIENT", "LIST", "ID", Long.toString(id))).contains("id=" + id + " ");
  }

  private static String str(Object reply) {
    return reply instanceof byte[]
        ? new String((byte[]) reply, StandardCharsets.UTF_8)
        : String.valueOf(reply);
  }

  /** {@code cmdstat_<command>:calls=N} of {@code INFO commandstats}, 0 when absent. */
  private long calls(String command) {
    Matcher m =
        Pattern.compile("(?mi)^cmdstat_" + Pattern.quote(command) + ":calls=(\\d+)")
            .matcher(server.info("commandstats"));
    return m.find() ? Long.parseLong(m.group(1)) : 0;
  }

  private void waitUntilWaiting(long n) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (server.wardenInfo("waiting_clients") != n) {
      assertTrue(System.nanoTime() < end, n + " waiting never seen");
      sleep(1);
    }
  }

  /**
   * One wait of {@code shape} on {@code k} through {@code w}, behind a holder, abandoned ({@code
   * how}) once the server has it queued; {@code race}: the holder lets go in the same instant (the
   * grant then races the abort). Checks that the waiter is out at once (an interrupt) or soon (a
   * cancel), and that nothing is held once the holder and any raced grant are gone. Answers the
   * waiter connection's client id, or -1 when the grant won the race.
   */
  private long abandonQueuedWait(Warden w, Shape shape, String k, Abandon how, boolean race)
      throws Exception {
    String where = shape.name + " " + how + (race ? " racing the grant" : "");
    AutoCloseable holder = shape.hold.apply(warden);
    Object outcome;
    long id;
    if (how == Abandon.INTERRUPT) {
      AtomicReference<Object> got = new AtomicReference<>();
      Thread t =
          new Thread(
              () -> {
                try {
                  Optional<? extends AutoCloseable> o =
                      shape.wait.apply(w).call(Duration.ofSeconds(20));
                  got.set(o.isPresent() ? o.get() : "timeout");
                } catch (InterruptedException e) {
                  got.set("interrupted");
                } catch (Throwable e) {
                  got.set(e);
                }
              });
      t.start();
      waitUntilWaiting(1);
      id = blockedIn(shape.command);
      if (race) {
        holder.close();
      }
      t.interrupt();
      t.join(20_000);
      assertFalse(t.isAlive(), where + ": still waiting");
      outcome = got.get();
      if (!(outcome instanceof AutoCloseable)) {
        assertEquals("interrupted", outcome, where);
        // Out of the queue before the interrupted call returned.
        assertEquals(0, server.wardenInfo("waiting_clients"), where + ": still queued");
      }
    } else {
      CompletableFuture<? extends Optional<? extends AutoCloseable>> f =
          shape.waitAsync.apply(w).call(Duration.ofSeconds(20));
      waitUntilWaiting(1);
      id = blockedIn(shape.command);
      if (race) {
        holder.close();
      }
      f.cancel(true);
      outcome = "cancelled";
      if (!f.isCancelled()) {
        Optional<? extends AutoCloseable> o = f.get(10, TimeUnit.SECONDS);
        outcome = o.isPresent() ? o.get() : "timeout";
      }
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (server.wardenInfo("waiting_clients") != 0 && System.nanoTime() < end) {
        sleep(1);
      }
      assertEquals(0, server.wardenInfo("waiting_clients"), where + ": still queued");
    }
    assertTrue(id > 0, where + ": no waiter in CLIENT LIST");
    if (outcome instanceof AutoCloseable) {
      // The grant won the race before the abort was seen: the caller has it.
      assertTrue(race, where + ": granted while the holder held");
      ((AutoCloseable) outcome).close();
      id = -1;
    } else {
      assertFalse(outcome instanceof Throwable, where + ": " + outcome);
      if (!race) {
        // Nobody was granted: the holder still holds, alone.
        assertEquals(1L, server.call("EXISTS", k), where + ": the holder's hold is gone");
      }
    }
    if (!race) {
      holder.close();
    }
    assertNothingLeft(k, true);
    return id;
  }

  /**
   * An abort sends {@code WARDEN.WITHDRAW key owner}: the waiter leaves the queue at once, nobody
   * is granted, and its connection is kept, on every server (on Redis 7.0-7.2 {@code CLIENT
   * UNBLOCK} cannot end a module's wait, and closing the connection was the only way out).
   */
  @Test
  void anAbortWithdrawsTheWaiterAndKeepsItsConnection() throws Exception {
    for (Shape shape : shapes(key("withdraw"))) {
      for (Abandon how : Abandon.values()) {
        String k = key("withdraw");
        long before = calls("warden.withdraw");
        long id = abandonQueuedWait(warden, shape, k, how, false);
        assertTrue(stillConnected(id), shape.name + " " + how + ": the waiter connection closed");
        assertEquals(1, calls("warden.withdraw") - before, shape.name + " " + how + ": WITHDRAWs");
        // The grant raced the abort: given back (or the caller has it, and releases it).
        for (int round = 0; round < 4; round++) {
          abandonQueuedWait(warden, shape, k, how, true);
        }
      }
    }
  }

  /**
   * A user refused {@code WARDEN.WITHDRAW} (an ACL; a module before 1.1.0 refuses it too): an abort
   * falls back to {@code CLIENT UNBLOCK} where it ends a module's wait (Redis 7.4+, Valkey 8+: the
   * connection kept), else closes the waiter's connection; the refusal is remembered, and the
   * command not sent again.
   */
  @Test
  void anAbortWhereWithdrawIsRefusedUnblocksOrClosesTheConnection() throws Exception {
    server.call(
        "ACL", "SETUSER", "nowithdraw", "on", ">pw", "~*", "&*", "+@all", "-warden.withdraw");
    server.call("ACL", "LOG", "RESET");
    boolean unblocks = server.unblocksWaiters();
    try (Warden w = Warden.create(transport(server, "nowithdraw", "pw"))) {
      for (Shape shape : shapes(key("refused"))) {
        for (Abandon how : Abandon.values()) {
          String k = key("refused");
          long id = abandonQueuedWait(w, shape, k, how, false);
          assertEquals(
              unblocks,
              stillConnected(id),
              shape.name
                  + " "
                  + how
                  + " on "
                  + server.version()
                  + ": the waiter connection "
                  + (unblocks ? "closed" : "kept"));
          for (int round = 0; round < 4; round++) {
            abandonQueuedWait(w, shape, k, how, true);
          }
        }
      }
    } finally {
      server.call("ACL", "DELUSER", "nowithdraw");
    }
    assertEquals(1, deniedCalls("warden.withdraw"), "WARDEN.WITHDRAW asked again once refused");
  }

  /**
   * A Warden closed while an abort's {@code WARDEN.WITHDRAW} is still on its way leaves no waiter
   * queued and nothing held: the close ends the wait, and the late {@code WITHDRAW} fails.
   */
  @Test
  void closingWhileAWithdrawIsInFlightLeavesNoWaiter() throws Exception {
    String k = key("closing");
    WardenLock holder = warden.lock(k).lease(Duration.ofSeconds(30)).acquire();
    RecordingTransport rec = new RecordingTransport(transport(server));
    rec.delayCommand("WARDEN.WITHDRAW", 300);
    Warden w = Warden.create(rec);
    CompletableFuture<Optional<WardenLock>> f =
        w.lock(k)
            .lease(Duration.ofSeconds(30))
            .tryAcquireAsync(Duration.ofSeconds(20))
            .toCompletableFuture();
    waitUntilWaiting(1);
    long before = calls("warden.withdraw");
    f.cancel(true);
    sleep(50); // the abort's WARDEN.WITHDRAW waits to be sent
    w.close();
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (server.wardenInfo("waiting_clients") != 0 && System.nanoTime() < end) {
      sleep(1);
    }
    assertEquals(0, server.wardenInfo("waiting_clients"), "still queued");
    holder.release();
    sleep(400); // the WITHDRAW's time to be sent has passed
    assertEquals(before, calls("warden.withdraw"), "WARDEN.WITHDRAW sent after the close");
    assertNothingLeft(k);
  }

  /** How many times {@code ACL LOG} saw {@code command} denied (one entry counts repeats). */
  private long deniedCalls(String command) {
    long n = 0;
    for (Object entry : (List<?>) server.call("ACL", "LOG")) {
      List<?> fields = (List<?>) entry;
      String object = null;
      long count = 0;
      for (int i = 0; i + 1 < fields.size(); i += 2) {
        String name = str(fields.get(i));
        if (name.equals("object")) {
          object = str(fields.get(i + 1));
        } else if (name.equals("count")) {
          count = Long.parseLong(str(fields.get(i + 1)));
        }
      }
      if (command.equalsIgnoreCase(object)) {
        n += count;
      }
    }
    return n;
  }

  @Test
  void aLateReplyIsGivenBack() throws Exception {
    // The caller's deadline passes while the waiter connection is still coming: no WAIT is sent,
    // and nothing is held once the call returns.
    String k = key("late");
    RecordingTransport rec = new RecordingTransport(transport(server));
    try (Warden w = Warden.create(rec)) {
      WardenLock h = w.lock(k).lease(Duration.ofSeconds(30)).acquire();
      rec.delayConnections(150);
      assertFalse(w.lock(k).tryAcquire(Duration.ofMillis(60)).isPresent());
      sleep(200);
      assertTrue(rec.waits().isEmpty(), "nothing sent past the deadline: " + rec.waits());
      h.release();
    }
    assertNothingLeft(k);
  }

  @Test
  void theWaitSentIsTheTimeThatRemains() throws Exception {
    String k = key("remaining");
    RecordingTransport rec = new RecordingTransport(transport(server));
    try (Warden w = Warden.create(rec)) {
      WardenLock h = w.lock(k).lease(Duration.ofSeconds(30)).acquire();
      rec.delayConnections(200);
      assertFalse(w.lock(k).tryAcquire(Duration.ofMillis(500)).isPresent());
      assertEquals(1, rec.waits().size());
      List<String> sent = rec.waits().get(0);
      assertEquals("LOCK.ACQUIRE", sent.get(0));
      int i = sent.indexOf("WAIT");
      long wait = Long.parseLong(sent.get(i + 1));
      // 500 ms from the call, less the 200 ms the connection took, less the margin.
      assertTrue(wait >= 1 && wait <= 300 - 1, "WAIT " + wait);
      h.release();
    }
    assertNothingLeft(k);
  }

  @Test
  void theFastPathOpensNoWaiterConnection() throws Exception {
    RecordingTransport rec = new RecordingTransport(transport(server));
    try (Warden w = Warden.create(rec)) {
      for (int i = 0; i < 20; i++) {
        w.lock(key("a"))
            .lease(Duration.ofSeconds(5))
            .tryAcquire(Duration.ofSeconds(5))
            .get()
            .release();
        w.getSemaphore(key("s"), 4)
            .tryAcquire(1, Duration.ofSeconds(5), Duration.ofSeconds(5))
            .get()
            .release();
        w.getReadWriteLock(key("rw")).read().lease(Duration.ofSeconds(5)).acquire().release();
      }
      assertEquals(0, rec.waitConnectionsAsked());
      // A busy one does.
      WardenLock h = w.lock(key("a")).lease(Duration.ofSeconds(5)).acquire();
      assertFalse(w.lock(key("a")).tryAcquire(Duration.ofMillis(20)).isPresent());
      assertEquals(1, rec.waitConnectionsAsked());
      h.release();
    }
  }

  @Test
  void threeHundredWaitersWithTheDefaultPool() throws Exception {
    String k = key("crowd");
    DistributedSemaphore sem = warden.getSemaphore(k, 3);
    AtomicInteger granted = new AtomicInteger();
    AtomicInteger inside = new AtomicInteger();
    AtomicInteger max = new AtomicInteger();
    AtomicReference<Throwable> failure = new AtomicReference<>();
    CountDownLatch go = new CountDownLatch(1);
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < 300; i++) {
      Thread t =
          new Thread(
              () -> {
                try {
                  go.await();
                  Optional<Permit> p =
                      sem.tryAcquire(1, Duration.ofSeconds(20), Duration.ofSeconds(10));
                  if (p.isPresent()) {
                    max.accumulateAndGet(inside.incrementAndGet(), Math::max);
                    sleep(1);
                    inside.decrementAndGet();
                    p.get().release();
                    granted.incrementAndGet();
                  }
                } catch (Throwable e) {
                  failure.set(e);
                }
              });
      t.start();
      threads.add(t);
    }
    go.countDown();
    join(threads);
    assertNull(failure.get(), () -> String.valueOf(failure.get()));
    assertEquals(300, granted.get());
    assertTrue(max.get() <= 3);
    assertNothingLeft(k);
  }

  @Test
  void maxQueueShedsWhenTheServerSupportsIt() throws Exception {
    String k = key("shed");
    try {
      server.call("LOCK.ACQUIRE", k + "probe", "o", "1000", "WAIT", "1", "QUEUE", "0");
    } catch (RespClient.RespError e) {
      assumeTrue(false, "this server's warden has no QUEUE: " + e.getMessage());
    }
    try (WardenLock h = warden.lock(k).lease(Duration.ofSeconds(30)).acquire()) {
      long shedBefore = server.wardenInfo("shed");
      long t0 = System.nanoTime();
      assertFalse(warden.lock(k).maxQueue(0).tryAcquire(Duration.ofSeconds(10)).isPresent());
      assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(10));
      assertEquals(shedBefore + 1, server.wardenInfo("shed"));
      assertTrue(h.isHeld());
    }
  }

  // ---- errors ----

  @Test
  void wrongTypeStaysWrongType() throws Exception {
    String k = key("string");
    server.call("SET", k, "v");
    WardenServerException e =
        assertThrows(
            WardenServerException.class,
            () -> warden.lock(k).lease(Duration.ofSeconds(5)).tryAcquire(Duration.ofSeconds(1)));
    assertTrue(e.getMessage().startsWith("WRONGTYPE"), e.getMessage());
    assertEquals("WRONGTYPE", e.code());
    // Also for a request that waits while the key is overwritten with another type.
    String k2 = key("overwritten");
    WardenLock h = warden.lock(k2).lease(Duration.ofSeconds(30)).acquire();
    CompletableFuture<Optional<WardenLock>> f =
        warden.lock(k2).tryAcquireAsync(Duration.ofSeconds(10)).toCompletableFuture();
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
    while (server.wardenInfo("waiting_clients") == 0 && System.nanoTime() < end) {
      sleep(2);
    }
    server.call("SET", k2, "v");
    ExecutionException ee = assertThrows(ExecutionException.class, f::get);
    assertTrue(ee.getCause() instanceof WardenServerException, String.valueOf(ee.getCause()));
    assertTrue(ee.getCause().getMessage().startsWith("WRONGTYPE"));
    assertThrows(WardenServerException.class, h::release);
  }

  @Test
  void aServerWithoutWardenSaysSo() throws Exception {
    try (RedisServer plain = RedisServer.startWithoutModule();
        Warden w = Warden.create(transport(plain))) {
      WardenNotLoadedException e =
          assertThrows(
              WardenNotLoadedException.class, () -> w.lock("k").tryAcquire(Duration.ofMillis(10)));
      assertTrue(e.getMessage().contains("is warden loaded?"), e.getMessage());
    }
  }

  // ---- fences, leases, the watchdog ----

  @Test
  void fencesRiseAcrossReleaseDeleteAndExpiry() throws Exception {
    String k = key("fence");
    List<Long> fences = new ArrayList<>();
    WardenLock a = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
    fences.add(a.fence());
    a.release();
    WardenLock b = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
    fences.add(b.fence());
    server.call("DEL", k);
    WardenLock c = warden.lock(k).lease(Duration.ofMillis(50)).acquire();
    fences.add(c.fence());
    sleep(120);
    assertFalse(c.isHeld());
    WardenLock d = warden.lock(k).lease(Duration.ofSeconds(10)).acquire();
    fences.add(d.fence());
    d.release();
    for (int i = 1; i < fences.size(); i++) {
      assertTrue(fences.get(i) > fences.get(i - 1), fences.toString());
    }
  }

  @Test
  void fencesRiseAcrossARestart() throws Exception {
    try (RedisServer own = RedisServer.start();
        Warden w = Warden.create(transport(own))) {
      WardenLock a = w.lock("k").lease(Duration.ofSeconds(30)).acquire();
      long before = a.fence();
      own.restart();
      // The client reconnects (a command on a dropped connection may fail once meanwhile).
      Optional<WardenLock> b = Optional.empty();
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
      while (!b.isPresent() && System.nanoTime() < end) {
        try {
          b = w.lock("k").lease(Duration.ofSeconds(30)).tryAcquire(Duration.ofSeconds(2));
        } catch (RuntimeException e) {
          sleep(50);
        }
      }
      assertTrue(b.isPresent());
      assertTrue(b.get().fence() > before, b.get().fence() + " after " + before);
      b.get().release();
    }
  }

  @Test
  void onLostRunsWhenTheLeaseEndsOrARenewalFails() throws Exception {
    String k = key("lost");
    CountDownLatch lost = new CountDownLatch(1);
    WardenLock h = warden.lock(k).lease(Duration.ofMillis(80)).acquire();
    h.onLost(lost::countDown);
    assertTrue(lost.await(5, TimeUnit.SECONDS));
    assertFalse(h.isHeld());
    // The watchdog: a renewal the server refuses (the key was deleted) loses the hold.
    CountDownLatch lost2 = new CountDownLatch(1);
    WardenLock w = warden.lock(k).watchdog(Duration.ofMillis(150)).acquire();
    w.onLost(lost2::countDown);
    server.call("DEL", k);
    assertTrue(lost2.await(5, TimeUnit.SECONDS));
    assertFalse(w.isHeld());
    w.release();
  }

  @Test
  void theWatchdogRenewsAndNeverExtendsAfterTheRelease() throws Exception {
    String k = key("dog");
    try (RespClient monitor = server.client()) {
      monitor.call("MONITOR");
      for (int i = 0; i < 30; i++) {
        // Renewals every 10 ms, released at varying points between them.
        WardenLock h = warden.lock(k).watchdog(Duration.ofMillis(30)).acquire();
        sleep(i % 5 == 0 ? 60 : i % 7);
        h.release();
      }
      // A lock held past its watchdog lease is still held (renewed).
      WardenLock h = warden.lock(k).watchdog(Duration.ofMillis(600)).acquire();
      sleep(1000);
      assertTrue(h.isHeld());
      assertNotNull(server.call("LOCK.INFO", k));
      h.release();
      sleep(100);
      server.call("SET", key("end"), "1");
      // MONITOR shows the server's order: per owner, no EXTEND after its RELEASE.
      java.util.Set<String> released = new java.util.HashSet<>();
      int extends_ = 0;
      while (true) {
        String line = String.valueOf(monitor.read());
        if (line.contains("\"" + key("end") + "\"")) {
          break;
        }
        String[] words = line.split("\"");
        if (words.length < 6) {
          continue;
        }
        String cmd = words[1].toUpperCase(java.util.Locale.ROOT);
        String owner = words[5];
        if (cmd.equals("LOCK.RELEASE")) {
          released.add(owner);
        } else if (cmd.equals("LOCK.EXTEND")) {
          extends_++;
          assertFalse(released.contains(owner), "EXTEND after RELEASE: " + line);
        }
      }
      assertTrue(extends_ > 0, "the watchdog renewed");
      assertEquals(31, released.size());
    }
  }

  // ---- cache ----

  @Test
  void getOrLoadLoadsOncePerMissAcrossCallers() throws Exception {
    String k = key("cache");
    WardenCache cache = warden.cache();
    AtomicInteger loads = new AtomicInteger();
    List<CompletableFuture<String>> results = new ArrayList<>();
    for (int i = 0; i < 8; i++) {
      results.add(
          CompletableFuture.supplyAsync(
              () ->
                  uncheck(
                      () ->
                          cache.getOrLoadString(
                              k,
                              Duration.ofSeconds(30),
                              () -> {
                                loads.incrementAndGet();
                                sleep(100);
                                return "value";
                              }))));
    }
    for (CompletableFuture<String> r : results) {
      assertEquals("value", r.get(30, TimeUnit.SECONDS));
    }
    assertEquals(1, loads.get());
    assertArrayEquals("value".getBytes(StandardCharsets.UTF_8), cache.getIfPresent(k));
    cache.invalidate(k);
    assertNull(cache.getIfPresent(k));
  }

  @Test
  void aFailedLoadAbandonsTheLease() throws Exception {
    String k = key("fail");
    WardenCache cache = warden.cache();
    assertThrows(
        IllegalStateException.class,
        () ->
            cache.getOrLoad(
                k,
                Duration.ofSeconds(30),
                () -> {
                  throw new IllegalStateException("db down");
                }));
    // The lease was abandoned: the next caller loads at once (not after the 10 s lease).
    long t0 = System.nanoTime();
    byte[] v = cache.getOrLoad(k, Duration.ofSeconds(30), () -> new byte[] {1, 2});
    assertArrayEquals(new byte[] {1, 2}, v);
    assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(5));
  }

  @Test
  void lockRequestOptionsAreChecked() {
    LockRequest r = warden.lock(key("o"));
    assertThrows(IllegalArgumentException.class, () -> r.maxQueue(-1));
    assertThrows(IllegalArgumentException.class, () -> warden.getSemaphore(key("s"), 0));
    try {
      warden.getSemaphore(key("s"), 2).tryAcquire(3, Duration.ZERO, null);
      fail("3 permits of 2");
    } catch (IllegalArgumentException | InterruptedException e) {
      // expected
    }
  }
}
