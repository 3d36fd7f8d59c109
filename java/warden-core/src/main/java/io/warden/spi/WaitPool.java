package io.warden.spi;

import io.warden.WaitConnection;
import io.warden.WardenException;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The bounded set of waiter connections a {@link io.warden.Transport} hands out, for transports'
 * use. A caller that finds every connection busy waits for one only until its deadline (then it is
 * answered {@code null}, a timeout): no request queues in the client past its caller's deadline,
 * and many waiters never raise a pool error.
 */
public abstract class WaitPool implements AutoCloseable {
  /** A pooled connection: {@link #release()} returns it, {@link #close()} discards it. */
  public abstract static class Pooled implements WaitConnection {
    private WaitPool pool;
    // Guarded by the pool's lock.
    private boolean inUse;
    private boolean closed;

    /** Closes the underlying connection (once). */
    protected abstract void closeConnection();

    @Override
    public final void release() {
      pool.giveBack(this);
    }

    @Override
    public final void close() {
      pool.discard(this);
    }

    /** Whether this connection was closed (discarded). */
    public final boolean isClosed() {
      pool.lock.lock();
      try {
        return closed;
      } finally {
        pool.lock.unlock();
      }
    }
  }

  private static final class Pending {
    final CompletableFuture<WaitConnection> future = new CompletableFuture<>();
  }

  private static final AtomicInteger THREADS = new AtomicInteger();

  private final int maxSize;
  private final int maxIdle;
  private final ReentrantLock lock = new ReentrantLock();
  // Guarded by lock.
  private int open;
  private boolean shut;
  private final Deque<Pooled> idle = new ArrayDeque<>();
  private final Deque<Pending> pending = new ArrayDeque<>();
  private final ScheduledThreadPoolExecutor timer;

  /**
   * @param maxSize waiter connections open at most (waits beyond it wait for one)
   * @param maxIdle idle connections kept for the next wait
   */
  protected WaitPool(int maxSize, int maxIdle) {
    if (maxSize < 1 || maxIdle < 0) {
      throw new IllegalArgumentException("maxSize must be >= 1 and maxIdle >= 0");
    }
    this.maxSize = maxSize;
    this.maxIdle = maxIdle;
    this.timer =
        new ScheduledThreadPoolExecutor(
            1,
            r -> {
              Thread t = new Thread(r, "warden-wait-pool-" + THREADS.incrementAndGet());
              t.setDaemon(true);
              return t;
            });
    timer.setRemoveOnCancelPolicy(true);
  }

  /** Opens a new connection, its {@code CLIENT ID} learned. */
  protected abstract CompletionStage<? extends Pooled> open();

  /**
   * A connection for one wait, or {@code null} once {@code deadlineNanos} ({@link
   * System#nanoTime()}; {@code Long.MAX_VALUE}: none) passes first.
   */
  public CompletionStage<WaitConnection> acquire(long deadlineNanos) {
    Pending p = new Pending();
    boolean openOne = false;
    lock.lock();
    try {
      if (shut) {
        p.future.completeExceptionally(new WardenException("the transport is closed"));
        return p.future;
      }
      Pooled c = idle.pollFirst();
      if (c != null) {
        c.inUse = true;
        p.future.complete(c);
        return p.future;
      }
      pending.addLast(p);
      if (open < maxSize) {
        open++;
        openOne = true;
      }
    } finally {
      lock.unlock();
    }
    if (deadlineNanos != Long.MAX_VALUE) {
      long delay = deadlineNanos - System.nanoTime();
      java.util.concurrent.ScheduledFuture<?> t =
          timer.schedule(() -> timedOut(p), Math.max(0, delay), TimeUnit.NANOSECONDS);
      p.future.whenComplete((c, e) -> t.cancel(false));
    }
    if (openOne) {
      openNew();
    }
    return p.future;
  }

  private void timedOut(Pending p) {
    lock.lock();
    try {
      pending.remove(p);
    } finally {
      lock.unlock();
    }
    p.future.complete(null);
  }

  private void openNew() {
    CompletionStage<? extends Pooled> opening;
    try {
      opening = open();
    } catch (RuntimeException e) {
      opening = failed(e);
    }
    opening.whenComplete(
        (c, e) -> {
          if (e != null || c == null) {
            Pending p;
            lock.lock();
            try {
              open--;
              // The oldest caller learns why (a server that refuses connections).
              p = pending.pollFirst();
            } finally {
              lock.unlock();
            }
            if (p != null) {
              p.future.completeExceptionally(
                  e != null ? e : new WardenException("no waiter connection"));
            }
            return;
          }
          Pooled pc = c;
          pc.pool = this;
          offer(pc);
        });
  }

  private static <T> CompletionStage<T> failed(Throwable e) {
    CompletableFuture<T> f = new CompletableFuture<>();
    f.completeExceptionally(e);
    return f;
  }

  /** Hands a free connection to the oldest caller still waiting, or keeps it idle. */
  private void offer(Pooled c) {
    while (true) {
      Pending p;
      lock.lock();
      try {
        if (shut) {
          c.closed = true;
          open--;
          p = null;
        } else {
          p = pending.pollFirst();
          if (p == null) {
            c.inUse = false;
            if (idle.size() < maxIdle) {
              idle.addFirst(c);
              return;
            }
            c.closed = true;
            open--;
          } else {
            c.inUse = true;
          }
        }
      } finally {
        lock.unlock();
      }
      if (p == null) {
        c.closeConnection();
        return;
      }
      if (p.future.complete(c)) {
        return;
      }
    }
  }

  private void giveBack(Pooled c) {
    lock.lock();
    try {
      if (c.closed || !c.inUse) {
        return;
      }
      c.inUse = false;
    } finally {
      lock.unlock();
    }
    offer(c);
  }

  private void discard(Pooled c) {
    boolean openOne = false;
    lock.lock();
    try {
      if (c.closed) {
        return;
      }
      c.closed = true;
      c.inUse = false;
      idle.remove(c);
      open--;
      if (!shut && !pending.isEmpty() && open < maxSize) {
        open++;
        openOne = true;
      }
    } finally {
      lock.unlock();
    }
    c.closeConnection();
    if (openOne) {
      openNew();
    }
  }

  /** Connections open now (idle and in use). */
  public int openConnections() {
    lock.lock();
    try {
      return open;
    } finally {
      lock.unlock();
    }
  }

  @Override
  public void close() {
    Deque<Pooled> toClose;
    Deque<Pending> waiting;
    lock.lock();
    try {
      shut = true;
      toClose = new ArrayDeque<>(idle);
      idle.clear();
      for (Pooled c : toClose) {
        c.closed = true;
        open--;
      }
      waiting = new ArrayDeque<>(pending);
      pending.clear();
    } finally {
      lock.unlock();
    }
    for (Pooled c : toClose) {
      c.closeConnection();
    }
    for (Pending p : waiting) {
      p.future.completeExceptionally(new WardenException("the transport is closed"));
    }
    timer.shutdownNow();
  }
}
