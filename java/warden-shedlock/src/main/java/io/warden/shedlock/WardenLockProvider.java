package io.warden.shedlock;

import io.warden.Transport;
import io.warden.Warden;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.CompletionException;
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
 *   <li>{@code lockAtMostFor} is the lock's lease: the server frees the lock when it ends, even if
 *       this process died.
 *   <li>A lock is tried once, without waiting ({@code LOCK.ACQUIRE} without {@code WAIT}): ShedLock
 *       skips a task whose lock is held elsewhere.
 *   <li>{@code lockAtLeastFor} is honoured on unlock: before it has passed the lease is shortened
 *       to what remains of it ({@code LOCK.EXTEND}); after, the lock is released ({@code
 *       LOCK.RELEASE}).
 *   <li>{@link SimpleLock#extend} resets the lease ({@code LOCK.EXTEND}); it fails (empty) once the
 *       lease has ended.
 * </ul>
 *
 * <p>Each lock is the key {@code keyPrefix + name} (default prefix {@value #DEFAULT_KEY_PREFIX}),
 * held by an owner unique to one acquisition ({@code host/random}), which {@code LOCK.INFO} shows.
 */
public final class WardenLockProvider implements ExtensibleLockProvider {
  /** The default key prefix: {@code shedlock:<lock name>}. */
  public static final String DEFAULT_KEY_PREFIX = "shedlock:";

  private final Transport transport;
  private final String keyPrefix;
  private final String host;

  public WardenLockProvider(Warden warden) {
    this(warden, DEFAULT_KEY_PREFIX);
  }

  public WardenLockProvider(Warden warden, String keyPrefix) {
    if (warden == null || keyPrefix == null) {
      throw new IllegalArgumentException("warden and keyPrefix must not be null");
    }
    this.transport = warden.transport();
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
    String key = key(config.getName());
    String owner = host + "/" + UUID.randomUUID();
    Object fence = call("LOCK.ACQUIRE", key, owner, Long.toString(lease));
    return fence == null
        ? Optional.empty()
        : Optional.of(new WardenSimpleLock(config, key, owner, (Long) fence));
  }

  private static long millisUntil(Instant until) {
    return Duration.between(ClockProvider.now(), until).toMillis();
  }

  private Object call(String... args) {
    byte[][] bytes = new byte[args.length][];
    for (int i = 0; i < args.length; i++) {
      bytes[i] = args[i].getBytes(StandardCharsets.UTF_8);
    }
    try {
      return transport.execute(bytes).toCompletableFuture().join();
    } catch (CompletionException e) {
      // The server's own error (WRONGTYPE, "is warden loaded?") is worth more than the wrapper.
      if (e.getCause() instanceof RuntimeException) {
        throw (RuntimeException) e.getCause();
      }
      throw e;
    }
  }

  /** One acquisition: its key, owner and fencing token. */
  private final class WardenSimpleLock extends AbstractSimpleLock {
    private final String key;
    private final String owner;
    private final long fence;

    WardenSimpleLock(LockConfiguration config, String key, String owner, long fence) {
      super(config);
      this.key = key;
      this.owner = owner;
      this.fence = fence;
    }

    @Override
    protected void doUnlock() {
      long atLeast = millisUntil(lockConfiguration.getLockAtLeastUntil());
      if (atLeast > 0) {
        // Keep the lock until lockAtLeastFor has passed, and not a moment longer.
        call("LOCK.EXTEND", key, owner, Long.toString(atLeast));
      } else {
        call("LOCK.RELEASE", key, owner);
      }
    }

    @Override
    protected Optional<SimpleLock> doExtend(LockConfiguration newConfig) {
      long lease = millisUntil(newConfig.getLockAtMostUntil());
      if (lease <= 0) {
        return Optional.empty();
      }
      Object r = call("LOCK.EXTEND", key, owner, Long.toString(lease));
      return Long.valueOf(1).equals(r)
          ? Optional.of(new WardenSimpleLock(newConfig, key, owner, fence))
          : Optional.empty();
    }

    @Override
    public String toString() {
      return "WardenSimpleLock{key=" + key + ", owner=" + owner + ", fence=" + fence + "}";
    }
  }
}
