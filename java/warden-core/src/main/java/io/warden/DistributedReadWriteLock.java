package io.warden;

import java.util.concurrent.locks.ReadWriteLock;

/** A {@link ReadWriteLock} on {@code RWLOCK.*}: many readers or one writer. */
public interface DistributedReadWriteLock extends ReadWriteLock {
  @Override
  DistributedLock readLock();

  @Override
  DistributedLock writeLock();

  /** Handle API for read holds. */
  LockRequest read();

  /** Handle API for write holds. */
  LockRequest write();
}
