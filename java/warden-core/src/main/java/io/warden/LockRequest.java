package io.warden;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletionStage;

/** How to take one hold: {@code warden.lock("k").lease(Duration.ofSeconds(10)).tryAcquire(...)}. */
public final class LockRequest {
  LockRequest() {}

  /** The lease; absent: a watchdog renews the hold while it is held. */
  public LockRequest lease(Duration lease) {
    throw new UnsupportedOperationException();
  }

  /** The watchdog's lease when no lease is given (default 30 s; renewed every third of it). */
  public LockRequest watchdog(Duration lease) {
    throw new UnsupportedOperationException();
  }

  /**
   * {@code QUEUE n}: with {@code n} or more already waiting, do not queue (reported as timeout).
   */
  public LockRequest maxQueue(int n) {
    throw new UnsupportedOperationException();
  }

  public WardenLock acquire() throws InterruptedException {
    throw new UnsupportedOperationException();
  }

  public Optional<WardenLock> tryAcquire(Duration wait) throws InterruptedException {
    throw new UnsupportedOperationException();
  }

  public CompletionStage<Optional<WardenLock>> tryAcquireAsync(Duration wait) {
    throw new UnsupportedOperationException();
  }
}
