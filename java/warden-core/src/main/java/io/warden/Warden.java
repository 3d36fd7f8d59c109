package io.warden;

import java.security.SecureRandom;
import java.time.Duration;
import java.util.List;
import java.util.Locale;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The entry point: locks, read-write locks, semaphores, rate limiters and cache leases on one
 * {@link Transport}.
 *
 * <pre>{@code
 * Warden warden = Warden.create(LettuceTransport.create(redisClient));
 * try (WardenLock lock = warden.lock("orders:42").lease(Duration.ofSeconds(10)).acquire()) {
 *   // ...
 * }
 * }</pre>
 */
public final class Warden implements AutoCloseable {
  /** Builds a {@link Warden}: {@code Warden.builder(transport).watchdogLease(...).build()}. */
  public static final class Builder {
    private final Transport transport;
    private Duration watchdogLease = Duration.ofSeconds(30);
    private Duration readMargin = Duration.ofSeconds(5);
    private Duration cacheLease = Duration.ofSeconds(10);
    private boolean closeTransport = true;

    Builder(Transport transport) {
      this.transport = transport;
    }

    /** The lease of holds taken without one, renewed every third of it (default 30 s). */
    public Builder watchdogLease(Duration lease) {
      this.watchdogLease = lease;
      return this;
    }

    /**
     * How much longer than its {@code WAIT} a blocking request waits for its reply before its
     * connection is taken as lost and closed (default 5 s).
     */
    public Builder readMargin(Duration margin) {
      this.readMargin = margin;
      return this;
    }

    /** The fill lease a cache miss takes (default 10 s): the longest a load may take. */
    public Builder cacheLease(Duration lease) {
      this.cacheLease = lease;
      return this;
    }

    /** Whether {@link Warden#close()} closes the transport too (default true). */
    public Builder closeTransport(boolean close) {
      this.closeTransport = close;
      return this;
    }

    public Warden build() {
      return new Warden(this);
    }
  }

  private static final AtomicInteger THREADS = new AtomicInteger();

  private final Transport transport;
  private final long watchdogMs;
  private final long readMarginMs;
  private final long cacheLeaseMs;
  private final boolean closeTransport;
  private final ScheduledThreadPoolExecutor scheduler;
  // Owners are unique, not secret (any client of the server can release any hold): 64 random
  // bits drawn once, then a counter, so no acquire waits on SecureRandom's lock.
  private final String ownerPrefix;
  private final AtomicLong ownerSeq;
  private final ConcurrentHashMap<ThreadHolds.Key, ThreadHolds.Entry> threadHolds =
      new ConcurrentHashMap<>();
  // The holds alive whose owner was made for them, by owner (see Hold.lend).
  private final ConcurrentHashMap<String, Hold> freshHolds = new ConcurrentHashMap<>();
  private volatile CompletableFuture<Boolean> unblocks;
  // The server refused WARDEN.WITHDRAW (a module before 1.1.0, an ACL that denies it): from then on
  // an abort goes straight to CLIENT UNBLOCK or closes the waiter's connection.
  private volatile boolean withdrawRefused;
  private volatile boolean unlockModeRefused;
  // Retries waiting on the scheduler, completed with a "no" when this Warden closes: a closed
  // scheduler drops what it has not run, and an abort that never ends leaves its waiter queued.
  private final Set<CompletableFuture<?>> retries = ConcurrentHashMap.newKeySet();
  private volatile boolean closed;
  // The server's warden.max-lease as its last refusal stated it (0: none seen). A lease asked
  // above it is granted at the cap and renewed by this client (Hold) up to the lease asked.
  private volatile long maxLeaseMs;
  // Requests of this process waiting, by command and key.
  private final ConcurrentHashMap<String, Integer> waiting = new ConcurrentHashMap<>();

  private Warden(Builder b) {
    this.transport = b.transport;
    this.watchdogMs = Math.max(3, LockRequest.ceilMillis(b.watchdogLease));
    this.readMarginMs = Math.max(1, b.readMargin.toMillis());
    this.cacheLeaseMs = Math.max(1, LockRequest.ceilMillis(b.cacheLease));
    this.closeTransport = b.closeTransport;
    this.scheduler =
        new ScheduledThreadPoolExecutor(
            1,
            r -> {
              Thread t = new Thread(r, "warden-timer-" + THREADS.incrementAndGet());
              t.setDaemon(true);
              return t;
            });
    scheduler.setRemoveOnCancelPolicy(true);
    // A tick every second keeps the timer's next wake-up near, so that a lease or deadline timer
    // due later is queued behind it without waking the timer thread. Without it each hold of a
    // busy lock, scheduling its lease end as it starts, woke the timer: two context switches a
    // hand-off.
    scheduler.scheduleAtFixedRate(() -> {}, 1, 1, TimeUnit.SECONDS);
    SecureRandom random = new SecureRandom();
    this.ownerPrefix = hex(random.nextLong());
    this.ownerSeq = new AtomicLong(random.nextLong());
  }

  public static Warden create(Transport transport) {
    return new Builder(transport).build();
  }

  public static Builder builder(Transport transport) {
    return new Builder(transport);
  }

  /** Handle API: one exclusive hold ({@code LOCK.*}) per acquire. */
  public LockRequest lock(String key) {
    Objects.requireNonNull(key, "key");
    return new LockRequest(this, Hold.Kind.LOCK, key);
  }

  /** A {@link java.util.concurrent.locks.Lock} on {@code key}, re-entrant per thread. */
  public DistributedLock getLock(String key) {
    Objects.requireNonNull(key, "key");
    return new ThreadLock(this, Hold.Kind.LOCK, key);
  }

  public DistributedReadWriteLock getReadWriteLock(String key) {
    Objects.requireNonNull(key, "key");
    return new RwLock(this, key);
  }

  /** A semaphore of {@code limit} permits (every acquire states it; SEM.SETLIMIT changes it). */
  public DistributedSemaphore getSemaphore(String key, int limit) {
    Objects.requireNonNull(key, "key");
    return new Semaphore(this, key, limit, -1);
  }

  /**
   * A rate limiter of {@code count} tokens every {@code period} (a whole number of ms), at most
   * {@code count} at once unless {@link WardenRateLimiter#burst} says otherwise; every request
   * states the rate ({@code RATE.CONFIG}, {@link WardenRateLimiter#setRate}, changes it).
   */
  public WardenRateLimiter rateLimiter(String key, long count, Duration period) {
    Objects.requireNonNull(key, "key");
    Objects.requireNonNull(period, "period");
    return new RateLimiter(this, key, count, period);
  }

  public WardenCache cache() {
    return new Cache(this, cacheLeaseMs);
  }

  /**
   * A {@link NearCache} with the default bounds (10,000 values, 64 MiB): values kept in this
   * process, dropped when the server says; {@link NearCache#builder} sets the bounds.
   */
  public NearCache nearCache() {
    return NearCache.builder(this).build();
  }

  public Transport transport() {
    return transport;
  }

  @Override
  public void close() {
    // Set first: a retry registered after the loop below sees it and ends at once.
    closed = true;
    scheduler.shutdownNow();
    for (CompletableFuture<?> retry : retries) {
      retry.complete(null);
    }
    if (closeTransport) {
      transport.close();
    }
  }

  // ---- shared by the implementations ----

  void waiting(String queue, int delta) {
    waiting.merge(queue, delta, (a, b) -> a + b <= 0 ? null : a + b);
  }

  int waitingHere(String queue) {
    Integer n = waiting.get(queue);
    return n == null ? 0 : n;
  }

  ScheduledExecutorService scheduler() {
    return scheduler;
  }

  ConcurrentHashMap<String, Hold> freshHolds() {
    return freshHolds;
  }

  boolean closed() {
    return closed;
  }

  /**
   * Runs {@code task} in {@code ms} on the scheduler, unless this Warden closes first: then {@code
   * f} completes with null at once (a closed scheduler drops what it has not run, which would leave
   * {@code f} pending for ever).
   */
  <T> void retryLater(CompletableFuture<T> f, Runnable task, long ms) {
    retries.add(f);
    f.whenComplete((r, e) -> retries.remove(f));
    if (closed) {
      f.complete(null);
      return;
    }
    try {
      scheduler.schedule(task, ms, TimeUnit.MILLISECONDS);
    } catch (RejectedExecutionException e) {
      f.complete(null);
    }
  }

  /**
   * Sends what {@code send} sends in a thread of its own (not the scheduler's: a blocking transport
   * would hold the renewals of other holds) until it is answered, a reply or an error reply, or
   * {@code untilNanos} (a {@link System#nanoTime()} value) passes, or this Warden closes: 50 ms
   * apart, doubling to 1 s. Then {@code done} runs.
   */
  void untilAnswered(Supplier<CompletionStage<?>> send, long untilNanos, Runnable done) {
    Thread t =
        new Thread(
            () -> {
              try {
                long pause = 50;
                while (!closed) {
                  try {
                    send.get().toCompletableFuture().get(5, TimeUnit.SECONDS);
                    return;
                  } catch (ExecutionException e) {
                    if (Resp.unwrap(e.getCause()) instanceof WardenServerException) {
                      return;
                    }
                  } catch (TimeoutException | RuntimeException e) {
                    // no answer: again, while the lease lasts
                  }
                  if (System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(pause) - untilNanos > 0) {
                    return; // the lease ends the hold anyway
                  }
                  Thread.sleep(pause);
                  pause = Math.min(2 * pause, 1000);
                }
              } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
              } finally {
                done.run();
              }
            },
            "warden-release-again");
    t.setDaemon(true);
    t.start();
  }

  long watchdogLeaseMillis() {
    return watchdogMs;
  }

  long readMarginMillis() {
    return readMarginMs;
  }

  ConcurrentHashMap<ThreadHolds.Key, ThreadHolds.Entry> threadHolds() {
    return threadHolds;
  }

  /** A fresh owner: 128 bits, hex, unique (a random prefix per Warden and a counter). */
  String newOwner() {
    return ownerPrefix + hex(ownerSeq.getAndIncrement());
  }

  private static String hex(long v) {
    StringBuilder sb = new StringBuilder(16);
    for (int shift = 60; shift >= 0; shift -= 4) {
      sb.append(Character.forDigit((int) (v >>> shift) & 0xf, 16));
    }
    return sb.toString();
  }

  /** What a token reply means, and how to give it back. */
  Attempt.Kind tokenKind(Hold.Kind kind, String key, String owner, boolean ownOwner) {
    return new Attempt.Kind() {
      @Override
      public boolean granted(Object reply) {
        return reply != null;
      }

      @Override
      public CompletionStage<?> giveBack(Object reply) {
        return unlock(kind, key, owner, !ownOwner);
      }

      @Override
      public CompletionStage<?> giveBackUnseen() {
        // The owner is this request's own: releasing it frees at most what it was granted
        // (a borrowed owner, a downgrade's, may hold more: left to its lease).
        return ownOwner ? unlock(kind, key, owner, false) : CompletableFuture.completedFuture(null);
      }

      @Override
      public boolean withdrawable() {
        // WARDEN.WITHDRAW takes out every request of the owner queued on the key: only an owner
        // made for this request names nothing else (a borrowed one is taken out otherwise).
        return ownOwner;
      }
    };
  }

  /**
   * One release of {@code owner}'s holds of {@code kind} on {@code key}: a read-write lock's names
   * its mode ({@code RWLOCK.UNLOCK key owner READ|WRITE}), so that a downgraded owner's read
   * release keeps its write hold. A module before 1.1.0 refuses the mode (remembered: this Warden
   * sends the form without from then on, which ends an owner's write holds first); there a {@code
   * borrowed} owner's read (a downgrade's, given back) is not released: that would end the write
   * hold, and let readers in beside the writer. It ends with its lease.
   */
  CompletionStage<Object> unlock(Hold.Kind kind, String key, String owner, boolean borrowed) {
    if (kind.mode == null) {
      return transport.execute(Resp.args(kind.release, key, owner));
    }
    if (unlockModeRefused) {
      return unlockWithoutMode(kind, key, owner, borrowed);
    }
    CompletableFuture<Object> out = new CompletableFuture<>();
    transport
        .execute(Resp.args(kind.release, key, owner, kind.mode))
        .whenComplete(
            (reply, e) -> {
              if (e == null) {
                out.complete(reply);
                return;
              }
              Throwable cause = Resp.unwrap(e);
              if (!(cause instanceof WardenServerException)
                  || !refusesMode((WardenServerException) cause)) {
                out.completeExceptionally(e);
                return;
              }
              unlockModeRefused = true;
              unlockWithoutMode(kind, key, owner, borrowed)
                  .whenComplete(
                      (again, error) -> {
                        if (error != null) {
                          out.completeExceptionally(error);
                        } else {
                          out.complete(again);
                        }
                      });
            });
    return out;
  }

  private CompletionStage<Object> unlockWithoutMode(
      Hold.Kind kind, String key, String owner, boolean borrowed) {
    return kind == Hold.Kind.READ && borrowed
        ? CompletableFuture.completedFuture(null)
        : transport.execute(Resp.args(kind.release, key, owner));
  }

  private static boolean refusesMode(WardenServerException e) {
    String m = e.getMessage() == null ? "" : e.getMessage();
    return m.toLowerCase(Locale.ROOT).contains("wrong number of arguments");
  }

  /**
   * {@code WARDEN.WITHDRAW key owner} on the shared connection: true when the server took {@code
   * owner}'s requests queued on {@code key} out of the queue (each is answered nil on its own
   * connection, which stays usable). False when it took none (a grant on its way, a request not on
   * the server yet, a replica), the command failed, or the server refuses it: an error reply (a
   * module before 1.1.0, an ACL) is remembered, and this Warden does not ask again.
   */
  CompletionStage<Boolean> withdraw(byte[] key, byte[] owner) {
    if (withdrawRefused) {
      return CompletableFuture.completedFuture(false);
    }
    CompletionStage<Object> sent;
    try {
      sent = transport.execute(Resp.args("WARDEN.WITHDRAW", key, owner));
    } catch (RuntimeException e) {
      return CompletableFuture.completedFuture(false);
    }
    return sent.handle(
        (n, e) -> {
          if (e != null) {
            Throwable cause = Resp.unwrap(e);
            if (cause instanceof WardenServerException
                && refusesCommand((WardenServerException) cause)) {
              withdrawRefused = true;
            }
            return false;
          }
          try {
            Long taken = Resp.asLong(n);
            return taken != null && taken > 0;
          } catch (RuntimeException notAnInteger) {
            return false;
          }
        });
  }

  /**
   * A cluster's redirect ({@code MOVED}, {@code ASK}): the command is not refused, only elsewhere.
   */
  private static boolean redirect(WardenServerException e) {
    String code = e.code();
    return code.equals("MOVED") || code.equals("ASK");
  }

  /**
   * An error that says the command itself is refused here: an ACL ({@code NOPERM}), or a server
   * without it (a module before 1.1.0, a renamed command). Not a passing state ({@code BUSY},
   * {@code LOADING}, a redirect), after which it is asked again.
   */
  private static boolean refusesCommand(WardenServerException e) {
    String m = e.getMessage() == null ? "" : e.getMessage();
    return !redirect(e)
        && (e.code().equals("NOPERM") || m.toLowerCase(Locale.ROOT).contains("unknown command"));
  }

  /**
   * Whether the server's {@code CLIENT UNBLOCK} takes a warden waiter out of its queue (Redis &gt;=
   * 7.4, Valkey &gt;= 8), learned once from {@code INFO server}.
   */
  CompletionStage<Boolean> unblocksWaiters() {
    CompletableFuture<Boolean> known = unblocks;
    if (known != null) {
      return known;
    }
    CompletableFuture<Boolean> f = new CompletableFuture<>();
    unblocks = f;
    transport
        .execute(Resp.args("INFO", "server"))
        .whenComplete(
            (info, e) -> {
              if (e != null) {
                unblocks = null;
                f.complete(false);
              } else {
                f.complete(unblocksModuleWaiters(Resp.str(info)));
              }
            });
    return f;
  }

  private static final Pattern MAX_LEASE =
      Pattern.compile("ttl exceeds warden\\.max-lease: expected an integer from 1 to (\\d+)");

  /** {@code ms}, or the server's {@code warden.max-lease} when known and smaller. */
  long capLease(long ms) {
    long cap = maxLeaseMs;
    return cap > 0 && ms > cap ? cap : ms;
  }

  /**
   * Whether {@code error} is the server's {@code ERR ttl exceeds warden.max-lease: expected an
   * integer from 1 to N (ms)}; if so N is remembered as the cap. The cap is learned from this
   * refusal, not from {@code CONFIG GET} (which ACLs often forbid), and again whenever the server
   * refuses a lease (an operator may lower it at run time).
   */
  boolean learnMaxLease(Throwable error) {
    Throwable e = Resp.unwrap(error);
    if (!(e instanceof WardenServerException) || e.getMessage() == null) {
      return false;
    }
    Matcher m = MAX_LEASE.matcher(e.getMessage());
    if (!m.find()) {
      return false;
    }
    try {
      maxLeaseMs = Long.parseLong(m.group(1));
    } catch (NumberFormatException tooLong) {
      return false;
    }
    return true;
  }

  static boolean unblocksModuleWaiters(String info) {
    Matcher v = Pattern.compile("(?m)^valkey_version:(\\d+)\\.(\\d+)").matcher(info);
    if (v.find()) {
      return Integer.parseInt(v.group(1)) >= 8;
    }
    Matcher r = Pattern.compile("(?m)^redis_version:(\\d+)\\.(\\d+)").matcher(info);
    if (r.find()) {
      int major = Integer.parseInt(r.group(1));
      int minor = Integer.parseInt(r.group(2));
      return major > 7 || (major == 7 && minor >= 4);
    }
    return false;
  }

  /**
   * Completes once the server no longer lists client {@code id} (a closed connection takes it a
   * moment to notice), or after {@code ms}.
   */
  CompletionStage<Void> gone(long id, long ms) {
    CompletableFuture<Void> done = new CompletableFuture<>();
    if (id <= 0) {
      done.complete(null);
      return done;
    }
    long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
    pollGone(id, end, done);
    return done;
  }

  private void pollGone(long id, long end, CompletableFuture<Void> done) {
    transport
        .execute(Resp.args("CLIENT", "LIST", "ID", Long.toString(id)))
        .whenComplete(
            (list, e) -> {
              String s = e == null ? Resp.str(list) : null;
              if (s == null || !s.contains("id=" + id + " ") || System.nanoTime() - end >= 0) {
                done.complete(null);
                return;
              }
              retryLater(done, () -> pollGone(id, end, done), 2);
            });
  }

  /** Runs a command synchronously on the shared connection, errors rethrown unchecked. */
  Object call(Object... args) {
    return execute(Resp.args(args));
  }

  /** As {@link #call}, with the arguments already encoded. */
  Object execute(byte[]... args) {
    try {
      return transport.execute(args).toCompletableFuture().join();
    } catch (RuntimeException e) {
      throw Resp.rethrow(e);
    }
  }

  static List<Object> list(Object reply) {
    return Resp.asList(reply);
  }
}
