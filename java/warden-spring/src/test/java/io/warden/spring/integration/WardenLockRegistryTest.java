package io.warden.spring.integration;

import static io.warden.spring.ServerInfo.awaitWaiters;
import static io.warden.spring.ServerInfo.lockInfo;
import static org.assertj.core.api.Assertions.assertThat;
import static org.assertj.core.api.Assertions.assertThatThrownBy;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import io.warden.spring.integration.WardenLockRegistry.WardenRegistryLock;
import io.warden.testing.RedisServer;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The behaviours of spring-integration's RedisLockRegistryTests, written for warden, on a real
 * server; "another JVM" is a second registry on its own client (its own connections).
 */
@Tag("integration")
class WardenLockRegistryTest {
  private static RedisServer server;
  private static RedisClient clientA;
  private static RedisClient clientB;
  private static Warden wardenA;
  private static Warden wardenB;

  @BeforeAll
  static void start() {
    server = RedisServer.start();
    clientA = RedisClient.create(server.uri());
    clientB = RedisClient.create(server.uri());
    wardenA = Warden.create(LettuceTransport.create(clientA));
    wardenB = Warden.create(LettuceTransport.create(clientB));
  }

  @AfterAll
  static void stop() {
    wardenA.close();
    wardenB.close();
    clientA.shutdown();
    clientB.shutdown();
    server.close();
  }

  private static String registryKey() {
    return "reg-" + UUID.randomUUID();
  }

  @Test
  void reentrantPerThreadOverOneServerHold() throws Exception {
    WardenLockRegistry registry = new WardenLockRegistry(wardenA, registryKey());
    WardenRegistryLock lock = registry.obtain("k");
    assertThat(registry.obtain("k")).isSameAs(lock);
    lock.lock();
    assertThat(lock.tryLock(1, TimeUnit.SECONDS)).isTrue();
    lock.lockInterruptibly();
    Map<String, Object> info = lockInfo(server, lock.key());
    assertThat(info.get("holds")).isEqualTo(1L);
    lock.unlock();
    lock.unlock();
    assertThat(lockInfo(server, lock.key())).isNotNull();
    lock.unlock();
    assertThat(lockInfo(server, lock.key())).isNull();
  }

  @Test
  void exclusiveAcrossRegistries() throws Exception {
    String key = registryKey();
    WardenLockRegistry a = new WardenLockRegistry(wardenA, key);
    WardenLockRegistry b = new WardenLockRegistry(wardenB, key);
    WardenRegistryLock la = a.obtain("job");
    WardenRegistryLock lb = b.obtain("job");
    la.lock();
    assertThat(lb.tryLock()).isFalse();
    assertThat(lb.tryLock(50, TimeUnit.MILLISECONDS)).isFalse();
    la.unlock();
    assertThat(lb.tryLock()).isTrue();
    assertThat(la.tryLock()).isFalse();
    lb.unlock();
  }

  @Test
  void aWaiterWaitsOnTheServerAndIsGrantedAtTheRelease() throws Exception {
    String key = registryKey();
    WardenRegistryLock la = new WardenLockRegistry(wardenA, key).obtain("job");
    WardenRegistryLock lb = new WardenLockRegistry(wardenB, key).obtain("job");
    la.lock();
    CompletableFuture<Long> fence =
        CompletableFuture.supplyAsync(
            () -> {
              try {
                assertThat(lb.tryLock(30, TimeUnit.SECONDS)).isTrue();
                long f = lb.fence();
                lb.unlock();
                return f;
              } catch (InterruptedException e) {
                throw new IllegalStateException(e);
              }
            });
    // Queued on the server (LOCK.ACQUIRE ... WAIT), not polling.
    awaitWaiters(server, la.key(), 1);
    long mine = la.fence();
    la.unlock();
    assertThat(fence.get(30, TimeUnit.SECONDS)).isGreaterThan(mine);
  }

  @Test
  void executeLockedTimesOutWhileAnotherRegistryHoldsTheLock() throws Exception {
    String key = registryKey();
    WardenLockRegistry a = new WardenLockRegistry(wardenA, key);
    WardenLockRegistry b = new WardenLockRegistry(wardenB, key);
    WardenRegistryLock la = a.obtain("job");
    la.lock();
    AtomicBoolean ran = new AtomicBoolean();
    assertThatThrownBy(() -> b.executeLocked("job", Duration.ofMillis(100), () -> ran.set(true)))
        .isInstanceOf(TimeoutException.class);
    assertThat(ran).isFalse();
    assertThat(lockInfo(server, la.key()).get("waiters")).isEqualTo(0L);
    la.unlock();
    assertThat(b.executeLocked("job", Duration.ofSeconds(5), () -> "done")).isEqualTo("done");
    assertThat(lockInfo(server, la.key())).isNull();
  }

  @Test
  void unlockAfterTheLeaseEndedThrowsAndFreesTheLockLocally() throws Exception {
    WardenLockRegistry registry =
        new WardenLockRegistry(wardenA, registryKey(), Duration.ofMillis(100));
    WardenRegistryLock lock = registry.obtain("k");
    lock.lock();
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (lockInfo(server, lock.key()) != null && System.nanoTime() < end) {
      Thread.sleep(20);
    }
    assertThat(lockInfo(server, lock.key())).isNull();
    assertThatThrownBy(lock::unlock).isInstanceOf(ConcurrentModificationException.class);
    assertThat(lock.isAcquiredInThisProcess()).isFalse();
    assertThat(lock.tryLock()).isTrue();
    lock.unlock();
  }

  @Test
  void unlockByAThreadThatDoesNotHoldTheLockIsRefused() throws Exception {
    WardenRegistryLock lock = new WardenLockRegistry(wardenA, registryKey()).obtain("k");
    lock.lock();
    AtomicReference<Throwable> error = new AtomicReference<>();
    Thread t =
        new Thread(
            () -> {
              try {
                lock.unlock();
              } catch (Throwable e) {
                error.set(e);
              }
            });
    t.start();
    t.join();
    assertThat(error.get()).isInstanceOf(IllegalMonitorStateException.class);
    assertThat(lockInfo(server, lock.key())).isNotNull();
    lock.unlock();
  }

  @Test
  void anInterruptedTryLockLeavesNothingHeldOrQueued() throws Exception {
    String key = registryKey();
    WardenRegistryLock la = new WardenLockRegistry(wardenA, key).obtain("job");
    WardenRegistryLock lb = new WardenLockRegistry(wardenB, key).obtain("job");
    la.lock();
    AtomicReference<Throwable> outcome = new AtomicReference<>();
    Thread waiter =
        new Thread(
            () -> {
              try {
                outcome.set(new AssertionError("granted: " + lb.tryLock(30, TimeUnit.SECONDS)));
              } catch (Throwable e) {
                outcome.set(e);
              }
            });
    waiter.start();
    awaitWaiters(server, la.key(), 1);
    waiter.interrupt();
    waiter.join(10_000);
    assertThat(outcome.get()).isInstanceOf(InterruptedException.class);
    assertThat(lb.isAcquiredInThisProcess()).isFalse();
    awaitWaiters(server, la.key(), 0);
    String owner = (String) lockInfo(server, la.key()).get("owner");
    la.unlock();
    // Nobody was queued behind the holder: the release deletes the key.
    assertThat(lockInfo(server, la.key())).as("left behind after " + owner).isNull();
    assertThat(lb.tryLock()).isTrue();
    lb.unlock();
  }

  @Test
  void renewLockResetsTheLeaseOfAHeldLock() throws Exception {
    WardenLockRegistry registry =
        new WardenLockRegistry(wardenA, registryKey(), Duration.ofSeconds(2));
    WardenRegistryLock lock = registry.obtain("k");
    assertThatThrownBy(() -> registry.renewLock("k")).isInstanceOf(IllegalStateException.class);
    lock.lock();
    registry.renewLock("k", Duration.ofSeconds(60));
    assertThat((Long) server.call("PTTL", lock.key())).isGreaterThan(2_000L);
    lock.unlock();
    assertThatThrownBy(() -> registry.renewLock("k")).isInstanceOf(IllegalStateException.class);
  }

  @Test
  void withoutExpireAfterAWatchdogKeepsTheHold() throws Exception {
    WardenRegistryLock lock = new WardenLockRegistry(wardenA, registryKey()).obtain("k");
    lock.lock();
    assertThat((Long) server.call("PTTL", lock.key())).isGreaterThan(2_000L);
    lock.unlock();
  }

  @Test
  void expireUnusedOlderThanForgetsOnlyUnheldLocks() throws Exception {
    WardenLockRegistry registry = new WardenLockRegistry(wardenA, registryKey());
    WardenRegistryLock idle = registry.obtain("idle");
    idle.lock();
    idle.unlock();
    WardenRegistryLock busy = registry.obtain("busy");
    busy.lock();
    Thread.sleep(5);
    registry.expireUnusedOlderThan(0);
    assertThat(registry.obtain("idle")).isNotSameAs(idle);
    assertThat(registry.obtain("busy")).isSameAs(busy);
    busy.unlock();
  }

  @Test
  void aKeyThatIsNotAStringIsRefused() {
    WardenLockRegistry registry = new WardenLockRegistry(wardenA, registryKey());
    assertThatThrownBy(() -> registry.obtain(42)).isInstanceOf(IllegalArgumentException.class);
  }

  @Test
  void lockIsNotInterruptible() throws Exception {
    String key = registryKey();
    WardenRegistryLock la = new WardenLockRegistry(wardenA, key).obtain("job");
    WardenRegistryLock lb = new WardenLockRegistry(wardenB, key).obtain("job");
    la.lock();
    CompletableFuture<Boolean> interruptedAfter = new CompletableFuture<>();
    Thread t =
        new Thread(
            () -> {
              lb.lock();
              interruptedAfter.complete(Thread.currentThread().isInterrupted());
              lb.unlock();
            });
    t.start();
    awaitWaiters(server, la.key(), 1);
    t.interrupt();
    Thread.sleep(50);
    la.unlock();
    try {
      assertThat(interruptedAfter.get(30, TimeUnit.SECONDS)).isTrue();
    } catch (ExecutionException e) {
      throw new AssertionError(e);
    }
    t.join();
  }
}
