package io.warden.spring.integration;

import io.warden.LockRequest;
import io.warden.Warden;
import io.warden.WardenLock;
import java.time.Duration;
import java.util.ConcurrentModificationException;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.springframework.integration.support.locks.DistributedLock;
import org.springframework.integration.support.locks.ExpirableLockRegistry;
import org.springframework.integration.support.locks.RenewableLockRegistry;

/**
 * A Spring Integration {@link org.springframework.integration.support.locks.LockRegistry} on
 * warden's exclusive locks ({@code LOCK.*}), a drop-in for {@code RedisLockRegistry}.
 *
 * <p>{@link #obtain(Object)} gives the same {@link DistributedLock} for a key until {@link
 * #expireUnusedOlderThan} drops it. The lock is re-entrant per thread (a local {@link
 * ReentrantLock} over one server hold, as {@code RedisLockRegistry}'s) and exclusive across
 * registries and JVMs (the key {@code registryKey:key} on the server). A busy lock is waited for on
 * the server, in its FIFO queue ({@code LOCK.ACQUIRE ... WAIT}): no polling, no pub/sub, a waiter
 * is granted the lock the moment it is freed; {@code tryLock(timeout)} passes its deadline to the
 * server. An interrupted wait leaves nothing held or queued.
 *
 * <p>Leases: with {@code expireAfter} every hold has that lease (as {@code RedisLockRegistry}'s);
 * without it a watchdog renews the hold while it is held, so a held lock never expires under a live
 * holder and a dead holder's lock is freed one watchdog lease (30 s) later.
 *
 * <p>{@code unlock()} by a thread that does not hold the lock throws {@link
 * IllegalMonitorStateException}; an {@code unlock()} that finds the hold gone (its lease ended)
 * throws {@link ConcurrentModificationException}, as {@code RedisLockRegistry} does: what the lock
 * protected may have been changed by another holder meanwhile.
 */
public final class WardenLockRegistry
    implements ExpirableLockRegistry<WardenLockRegistry.WardenRegistryLock>,
        RenewableLockRegistry<WardenLockRegistry.WardenRegistryLock> {
  private static final Duration WATCHDOG_LEASE = Duration.ofSeconds(30);

  private final Warden warden;
  private final String registryKey;
  private final Duration expireAfter;
  private final ConcurrentHashMap<String, WardenRegistryLock> locks = new ConcurrentHashMap<>();
  private volatile int maxQueue = -1;

  /** Locks {@code registryKey:key}, renewed by a watchdog while held. */
  public WardenLockRegistry(Warden warden, String registryKey) {
    this(warden, registryKey, null);
  }

  /**
   * Locks {@code registryKey:key} with a lease of {@code expireAfter} ({@code null}: renewed by a
   * watchdog while held).
   */
  public WardenLockRegistry(Warden warden, String registryKey, Duration expireAfter) {
    if (warden == null || registryKey == null) {
      throw new IllegalArgumentException("warden and registryKey must not be null");
    }
    if (expireAfter != null && (expireAfter.isZero() || expireAfter.isNegative())) {
      throw new IllegalArgumentException("expireAfter must be positive (or null: a watchdog)");
    }
    this.warden = warden;
    this.registryKey = registryKey;
    this.expireAfter = expireAfter;
  }

  /**
   * Sheds load: a wait with {@code n} or more requests already queued on the key gives up at once
   * ({@code QUEUE n}), reported as a timeout ({@code tryLock} false). Negative: no limit.
   */
  public void setMaxQueue(int n) {
    this.maxQueue = n;
  }

  @Override
  public WardenRegistryLock obtain(Object lockKey) {
    if (!(lockKey instanceof String path)) {
      throw new IllegalArgumentException("a lock key must be a String, not " + lockKey);
    }
    return locks.computeIfAbsent(path, WardenRegistryLock::new);
  }

  /**
   * Forgets the locks last acquired more than {@code age} ms ago and not held in this JVM (their
   * objects only: nothing on the server changes).
   */
  @Override
  public void expireUnusedOlderThan(long age) {
    long now = System.currentTimeMillis();
    locks
        .values()
        .removeIf(l -> l.lockedAt > 0 && now - l.lockedAt > age && !l.isAcquiredInThisProcess());
  }

  /** Resets the lease of the lock held in this JVM for {@code lockKey} to the registry's lease. */
  @Override
  public void renewLock(Object lockKey) {
    renewLock(lockKey, expireAfter == null ? WATCHDOG_LEASE : expireAfter);
  }

  /**
   * Resets the lease of the lock held in this JVM for {@code lockKey} to {@code ttl} from now.
   *
   * @throws IllegalStateException when this JVM does not hold it (or its lease has ended)
   */
  @Override
  public void renewLock(Object lockKey, Duration ttl) {
    WardenRegistryLock lock = locks.get(String.valueOf(lockKey));
    WardenLock hold = lock == null ? null : lock.hold;
    if (hold == null || !hold.extend(ttl)) {
      throw new IllegalStateException("Could not renew mutex at " + registryKey + ":" + lockKey);
    }
  }

  private LockRequest request(String key, Duration ttl) {
    LockRequest r = warden.lock(key);
    if (ttl != null) {
      r = r.lease(ttl);
    }
    int n = maxQueue;
    if (n >= 0) {
      r = r.maxQueue(n);
    }
    return r;
  }

  /** One key's lock: re-entrant per thread, exclusive across JVMs. */
  public final class WardenRegistryLock implements DistributedLock {
    private final String key;
    private final ReentrantLock local = new ReentrantLock();

    /** The server hold; set and cleared only by the thread holding {@link #local}. */
    private volatile WardenLock hold;

    private volatile long lockedAt;

    private WardenRegistryLock(String path) {
      this.key = registryKey + ":" + path;
    }

    /** The server key. */
    public String key() {
      return key;
    }

    @Override
    public void lock() {
      lock(expireAfter);
    }

    /** Waits for the lock, uninterruptibly (an interrupt is kept for later). */
    @Override
    public void lock(Duration ttl) {
      local.lock();
      if (local.getHoldCount() > 1) {
        return;
      }
      boolean interrupted = false;
      try {
        while (true) {
          try {
            held(request(key, ttl).acquire());
            return;
          } catch (InterruptedException e) {
            interrupted = true; // lock() may not be interrupted: wait again
          }
        }
      } catch (RuntimeException | Error e) {
        local.unlock();
        throw e;
      } finally {
        if (interrupted) {
          Thread.currentThread().interrupt();
        }
      }
    }

    @Override
    public void lockInterruptibly() throws InterruptedException {
      local.lockInterruptibly();
      if (local.getHoldCount() > 1) {
        return;
      }
      try {
        held(request(key, expireAfter).acquire());
      } catch (InterruptedException | RuntimeException | Error e) {
        local.unlock();
        throw e;
      }
    }

    @Override
    public boolean tryLock() {
      try {
        return tryLock(Duration.ZERO, expireAfter);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return false;
      }
    }

    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
      return tryLock(Duration.ofNanos(unit.toNanos(Math.max(0, time))), expireAfter);
    }

    /**
     * Waits up to {@code waitTime} (measured from this call, the local queue included) for the
     * lock, then holds it with a lease of {@code ttl} ({@code null}: watchdog).
     */
    @Override
    public boolean tryLock(Duration waitTime, Duration ttl) throws InterruptedException {
      long deadline = System.nanoTime() + waitTime.toNanos();
      if (!local.tryLock(waitTime.toNanos(), TimeUnit.NANOSECONDS)) {
        return false;
      }
      if (local.getHoldCount() > 1) {
        return true;
      }
      try {
        Duration left = Duration.ofNanos(Math.max(0, deadline - System.nanoTime()));
        Optional<WardenLock> granted = request(key, ttl).tryAcquire(left);
        if (granted.isPresent()) {
          held(granted.get());
          return true;
        }
        local.unlock();
        return false;
      } catch (InterruptedException | RuntimeException | Error e) {
        local.unlock();
        throw e;
      }
    }

    private void held(WardenLock h) {
      hold = h;
      lockedAt = System.currentTimeMillis();
    }

    @Override
    public void unlock() {
      if (!local.isHeldByCurrentThread()) {
        throw new IllegalMonitorStateException("You do not own lock at " + key);
      }
      if (local.getHoldCount() > 1) {
        local.unlock();
        return;
      }
      WardenLock h = hold;
      hold = null;
      try {
        boolean stillHeld = h.isHeld();
        h.release();
        if (!stillHeld) {
          throw new ConcurrentModificationException(
              "Lock was released in the store due to expiration. "
                  + "The integrity of data protected by this lock may have been compromised: "
                  + key);
        }
      } finally {
        local.unlock();
      }
    }

    /** The fencing token of this JVM's hold; {@link IllegalMonitorStateException} if none. */
    public long fence() {
      WardenLock h = hold;
      if (h == null) {
        throw new IllegalMonitorStateException("lock at " + key + " is not held in this JVM");
      }
      return h.fence();
    }

    /** Whether a thread of this JVM holds this lock. */
    public boolean isAcquiredInThisProcess() {
      return local.isLocked();
    }

    public boolean isHeldByCurrentThread() {
      return local.isHeldByCurrentThread();
    }

    /** When this lock was last acquired (epoch ms; 0: never). */
    public long getLockedAt() {
      return lockedAt;
    }

    @Override
    public Condition newCondition() {
      throw new UnsupportedOperationException("Conditions are not supported");
    }

    @Override
    public String toString() {
      return "WardenRegistryLock[" + key + ", held here=" + isAcquiredInThisProcess() + "]";
    }
  }
}
