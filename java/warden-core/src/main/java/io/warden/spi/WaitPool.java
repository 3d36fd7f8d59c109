package io.warden.spi;

import io.warden.WaitConnection;
import io.warden.WardenException;
import java.util.ArrayDeque;
import java.util.Deque;
import java.util.HashSet;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The bounded set of waiter connections a {@link io.warden.Transport} hands out, for transports'
 * use. A caller that finds every connection busy waits for one only until its deadline (then it is
 * answered {@code null}, a timeout): no request queues in the client past its caller's deadline,
 * and many waiters never raise a pool error. Idle connections beyond {@code maxIdle} are closed
 * once unused for {@link #IDLE_GRACE_MS}: a load that comes and goes finds them open, not opening.
 */
public abstract class WaitPool implements AutoCloseable {
  /** A pooled connection: {@link #release()} returns it, {@link #close()} discards it. */
  public abstract static class Pooled implements WaitConnection {
    private WaitPool pool;
    // Guarded by the pool's lock.
    private boolean inUse;
    private boolean closed;
    private long idleSince;

    /** Closes the underlying connection (once). */
    protected abstract void closeConnection();

    /** Whether the connection was closed under the pool (by the server, or a network error). */
    protected boolean isBroken() {
      return false;
    }

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

  /**
   * One hand-out of a pooled connection. Invariant: a connection serves one wait at a time. A
   * release or close through a lease that has already ended is ignored, and so is a command sent
   * through it: a holder that lets go twice, or late, never releases, closes or writes to a
   * connection that another wait uses now.
   */
  private static final class Lease implements WaitConnection {
    private final Pooled c;
    private final AtomicBoolean ended = new AtomicBoolean();

    Lease(Pooled c) {
      this.c = c;
    }

    @Override
    public long clientId() {
      return c.clientId();
    }

    @Override
    public CompletionStage<Object> execute(long replyTimeoutMillis, byte[]... args) {
      if (ended.get()) {
        return failed(new WardenException("this waiter connection was already given back"));
      }
      return c.execute(replyTimeoutMillis, args);
    }

    @Override
    public void release() {
      if (ended.compareAndSet(false, true)) {
        c.release();
      }
    }

    @Override
    public void close() {
      if (ended.compareAndSet(false, true)) {
        c.close();
      }
    }
  }

  private static final class Pending {
    final CompletableFuture<WaitConnection> future = new CompletableFuture<>();
  }

  private static final AtomicInteger THREADS = new AtomicInteger();

  /** How long an idle connection beyond {@code maxIdle} stays open unused. */
  public static final long IDLE_GRACE_MS = 1000;

  private final int maxSize;
  private final int maxIdle;
  private final ReentrantLock lock = new ReentrantLock();
  // Guarded by lock.
  private int open;
  private boolean shut;
  private final Deque<Pooled> idle = new ArrayDeque<>();
  // Guarded by lock: the connections handed out now (close() closes them too: a wait in flight on
  // one would otherwise outlive the pool, queued on the server, its caller never answered).
  private final Set<Pooled> lent = new HashSet<>();
  private final Deque<Pending> pending = new ArrayDeque<>();
  private final ScheduledThreadPoolExecutor timer;
  // Guarded by lock: a trim of the idle connections beyond maxIdle is scheduled.
  private boolean trimming;

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
    Pooled c;
    while ((c = takeIdle()) != null) {
      if (!c.isBroken()) {
        p.future.complete(new Lease(c));
        return p.future;
      }
      discard(c);
    }
    lock.lock();
    try {
      if (shut) {
        p.future.completeExceptionally(new WardenException("the transport is closed"));
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
      p.future.whenComplete((got, e) -> t.cancel(false));
    }
    if (openOne) {
      openNew();
    }
    return p.future;
  }

  /** The most recently used idle connection, now in use; null if none. */
  private Pooled takeIdle() {
    lock.lock();
    try {
      Pooled c = shut ? null : idle.pollFirst();
      if (c != null) {
        c.inUse = true;
        lent.add(c);
      }
      return c;
    } finally {
      lock.unlock();
    }
  }

  /**
   * Opens up to {@code n} connections now, kept idle for the first waits (a failure is left to the
   * wait that needs a connection).
   */
  public void prewarm(int n) {
    for (int i = 0; i < n; i++) {
      lock.lock();
      try {
        if (shut || open >= maxSize) {
          return;
        }
        open++;
      } finally {
        lock.unlock();
      }
      openNew();
    }
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
    if (c.isBroken()) {
      discard(c);
      return;
    }
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
            // Kept idle, most recent first; those beyond maxIdle until unused for the grace.
            c.inUse = false;
            c.idleSince = System.nanoTime();
            idle.addFirst(c);
            if (idle.size() > maxIdle && !trimming) {
              trimming = true;
              scheduleTrim(IDLE_GRACE_MS);
            }
            return;
          } else {
            c.inUse = true;
            lent.add(c);
          }
        }
      } finally {
        lock.unlock();
      }
      if (p == null) {
        c.closeConnection();
        return;
      }
      if (p.future.complete(new Lease(c))) {
        return;
      }
      lock.lock();
      try {
        lent.remove(c);
      } finally {
        lock.unlock();
      }
    }
  }

  private void scheduleTrim(long delayMs) {
    try {
      timer.schedule(this::trim, delayMs, TimeUnit.MILLISECONDS);
    } catch (RuntimeException closed) {
      trimming = false;
    }
  }

  /** Closes the idle connections beyond maxIdle that were unused for the grace. */
  private void trim() {
    Deque<Pooled> toClose = new ArrayDeque<>();
    lock.lock();
    try {
      long now = System.nanoTime();
      long grace = TimeUnit.MILLISECONDS.toNanos(IDLE_GRACE_MS);
      while (idle.size() > maxIdle && now - idle.peekLast().idleSince >= grace) {
        Pooled c = idle.pollLast();
        c.closed = true;
        open--;
        toClose.add(c);
      }
      trimming = false;
      if (idle.size() > maxIdle && !shut) {
        trimming = true;
        long next = grace - (now - idle.peekLast().idleSince);
        scheduleTrim(Math.max(1, TimeUnit.NANOSECONDS.toMillis(next) + 1));
      }
    } finally {
      lock.unlock();
    }
    for (Pooled c : toClose) {
      c.closeConnection();
    }
  }

  private void giveBack(Pooled c) {
    lock.lock();
    try {
      if (c.closed || !c.inUse) {
        return;
      }
      c.inUse = false;
      lent.remove(c);
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
      lent.remove(c);
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
      toClose.addAll(lent);
      idle.clear();
      lent.clear();
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
