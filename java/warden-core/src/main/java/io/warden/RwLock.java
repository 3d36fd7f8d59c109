package io.warden;

/** {@link DistributedReadWriteLock} on {@code RWLOCK.*}. */
final class RwLock implements DistributedReadWriteLock {
  private final Warden warden;
  private final String key;
  private final DistributedLock read;
  private final DistributedLock write;

  RwLock(Warden warden, String key) {
    this.warden = warden;
    this.key = key;
    this.read = new ThreadLock(warden, Hold.Kind.READ, key);
    this.write = new ThreadLock(warden, Hold.Kind.WRITE, key);
  }

  @Override
  public DistributedLock readLock() {
    return read;
  }

  @Override
  public DistributedLock writeLock() {
    return write;
  }

  @Override
  public LockRequest read() {
    return new LockRequest(warden, Hold.Kind.READ, key);
  }

  @Override
  public LockRequest write() {
    return new LockRequest(warden, Hold.Kind.WRITE, key);
  }
}
