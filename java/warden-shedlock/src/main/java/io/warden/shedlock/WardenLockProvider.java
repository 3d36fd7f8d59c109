package io.warden.shedlock;

import io.warden.Warden;
import io.warden.WardenLock;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import net.javacrumbs.shedlock.core.AbstractSimpleLock;
import net.javacrumbs.shedlock.core.ClockProvider;
import net.javacrumbs.shedlock.core.ExtensibleLockProvider;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.SimpleLock;
import net.javacrumbs.shedlock.support.Utils;

/**
 * A ShedLock {@link net.javacrumbs.shedlock.core.LockProvider} on warden's exclusive locks ({@code
 * LOCK.*}).
 *
 * <ul>
 *   <li>{@code lockAtMostFor} is how long the lock is held at most: the job's lock ends then even
 *       if the job has not, and no later. Under the server's {@code warden.max-lease} (30 s in
 *       {@code redis.conf.example}) a longer {@code lockAtMostFor} is held with a lease of the cap,
 *       renewed by this process every third of it up to {@code lockAtMostFor} (as ShedLock's {@code
 *       KeepAliveLockProvider} keeps a lock alive, but never past {@code lockAtMostFor}): if this
 *       process dies, the lock is freed at most one cap later.
 *   <li>A lock is tried once, without waiting ({@code LOCK.ACQUIRE} without {@code WAIT}): ShedLock
 *       skips a task whose lock is held elsewhere.
 *   <li>{@code lockAtLeastFor} is honoured on unlock: before it has passed the lock is kept for
 *       what remains of it (renewed the same way past the cap); after, it is released ({@code
 *       LOCK.RELEASE}).
 *   <li>{@link SimpleLock#extend} resets how long the lock is held; it fails (empty) once the lock
 *       has been lost.
 * </ul>
 *
 * <p>Each lock is the key {@code keyPrefix + name} (default prefix {@value #DEFAULT_KEY_PREFIX}),
 * held by an owner unique to one acquisition ({@code host/random}), which {@code LOCK.INFO} shows.
 */
public final class WardenLockProvider implements ExtensibleLockProvider {
  /** The default key prefix: {@code shedlock:<lock name>}. */
  public static final String DEFAULT_KEY_PREFIX = "shedlock:";

  private final Warden warden;
  private final String keyPrefix;
  private final String host;

  public WardenLockProvider(Warden warden) {
    this(warden, DEFAULT_KEY_PREFIX);
  }

  public WardenLockProvider(Warden warden, String keyPrefix) {
    if (warden == null || keyPrefix == null) {
      throw new IllegalArgumentException("warden and keyPrefix must not be null");
    }
    this.warden = warden;
    this.keyPrefix = keyPrefix;
    this.host = Utils.getHostname();
  }

  /** The server key of the lock named {@code lockName}. */
  public String key(String lockName) {
    return keyPrefix + lockName;
  }

  @Override
  public Optional<SimpleLock> lock(LockConfiguration config) {
    long lease = millisUntil(config.getLockAtMostUntil());
    if (lease <= 0) {
      // lockAtMostFor has already passed: there is nothing left to hold.
      return Optional.empty();
    }
    Optional<WardenLock> hold;
    try {
      hold =
          warden
              .lock(key(config.getName()))
              .ownerTag(host)
              .lease(Duration.ofMillis(lease))
              .tryAcquire(Duration.ZERO);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return Optional.empty();
    }
    return hold.map(h -> new WardenSimpleLock(config, h));
  }

  private static long millisUntil(Instant until) {
    return Duration.between(ClockProvider.now(), until).toMillis();
  }

  /** One acquisition: its hold (key, owner, fencing token, renewals). */
  private static final class WardenSimpleLock extends AbstractSimpleLock {
    private final WardenLock hold;

    WardenSimpleLock(LockConfiguration config, WardenLock hold) {
      super(config);
      this.hold = hold;
    }

    @Override
    protected void doUnlock() {
      long atLeast = millisUntil(lockConfiguration.getLockAtLeastUntil());
      if (atLeast <= 0 || !hold.extend(Duration.ofMillis(atLeast))) {
        // Keep the lock until lockAtLeastFor has passed, and not a moment longer.
        hold.release();
      }
    }

    @Override
    protected Optional<SimpleLock> doExtend(LockConfiguration newConfig) {
      long lease = millisUntil(newConfig.getLockAtMostUntil());
      if (lease <= 0 || !hold.extend(Duration.ofMillis(lease))) {
        return Optional.empty();
      }
      return Optional.of(new WardenSimpleLock(newConfig, hold));
    }

    @Override
    public String toString() {
      return "WardenSimpleLock{key="
          + hold.key()
          + ", owner="
          + hold.owner()
          + ", fence="
          + hold.fence()
          + "}";
    }
  }
}
