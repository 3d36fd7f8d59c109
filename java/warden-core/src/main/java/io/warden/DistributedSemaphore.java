package io.warden;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletionStage;

/** A counting semaphore on {@code SEM.*}; each acquire gets its own owner, fence and lease. */
public interface DistributedSemaphore {
  /** Empty: not granted within {@code wait} (or shed by {@code maxQueue}). */
  Optional<Permit> tryAcquire(int permits, Duration wait, Duration lease)
      throws InterruptedException;

  /** Waits until granted. */
  Permit acquire(int permits, Duration lease) throws InterruptedException;

  CompletionStage<Optional<Permit>> tryAcquireAsync(int permits, Duration wait, Duration lease);

  /**
   * The same semaphore whose waits carry {@code QUEUE n}: with {@code n} or more requests already
   * waiting, a request is not queued and reports a timeout (empty).
   */
  DistributedSemaphore maxQueue(int n);

  /** Permits free now (the limit when nobody holds any). */
  int availablePermits();
}
