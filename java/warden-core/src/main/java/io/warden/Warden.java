package io.warden;

/**
 * The entry point: locks, read-write locks, semaphores and cache leases on one {@link Transport}.
 */
public final class Warden implements AutoCloseable {
  /** Builds a {@link Warden}: {@code Warden.builder(transport).watchdogLease(...).build()}. */
  public static final class Builder {
    private final Transport transport;

    Builder(Transport transport) {
      this.transport = transport;
    }

    public Warden build() {
      return new Warden(transport);
    }
  }

  public static Builder builder(Transport transport) {
    return new Builder(transport);
  }

  private final Transport transport;

  private Warden(Transport transport) {
    this.transport = transport;
  }

  public static Warden create(Transport transport) {
    return new Warden(transport);
  }

  public LockRequest lock(String key) {
    throw new UnsupportedOperationException();
  }

  public DistributedLock getLock(String key) {
    throw new UnsupportedOperationException();
  }

  public DistributedReadWriteLock getReadWriteLock(String key) {
    throw new UnsupportedOperationException();
  }

  public DistributedSemaphore getSemaphore(String key, int limit) {
    throw new UnsupportedOperationException();
  }

  public WardenCache cache() {
    throw new UnsupportedOperationException();
  }

  public Transport transport() {
    return transport;
  }

  @Override
  public void close() {
    transport.close();
  }
}
