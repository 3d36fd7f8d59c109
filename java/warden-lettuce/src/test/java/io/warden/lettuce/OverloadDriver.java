package io.warden.lettuce;

import io.lettuce.core.RedisClient;
import io.lettuce.core.api.StatefulRedisConnection;
import io.lettuce.core.codec.ByteArrayCodec;
import io.warden.DistributedSemaphore;
import io.warden.Warden;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The overload bench's driver for the Java client on Lettuce (bench/overload.py runs it; {@code
 * make bench SECTION=overload}). One run of one scenario against a server with the module; prints
 * one JSON object on stdout, as bench/overload_python.py does.
 *
 * <pre>
 * --port P         the server, 127.0.0.1:P
 * --client C       warden-lettuce: a thread per request (a cached pool, as a servlet container's),
 *                  each calling the blocking tryAcquire(wait); warden-lettuce-async: every request
 *                  through tryAcquireAsync on the driver's one thread, held by a timer (the
 *                  release, which blocks, on a pool thread)
 * --scenario S     overload or burst
 * --kind K         sem (a semaphore of --limit) or lock (limit 1)
 * --key KEY
 * overload: --limit --hold-ms --interval-ms --requests --deadline-ms
 *   one request every interval; each holds hold-ms once granted. Prints {"granted","late",
 *   "max_inside","errors","error_sample","lat_ms","span_ms","held_ms"} (as the Python driver).
 *   The same scenario runs once first on another key, unmeasured: a service's JVM is warm.
 * burst: --limit --requests --rounds
 *   per round a fresh Warden on a fresh RedisClient whose connection is open (one PING),
 *   `requests` threads acquiring at once with permits free. Prints {"first_ms","all_ms",
 *   "errors","error_sample"}; one unmeasured round first (warm JVM).
 * --version prints the versions (the client's and Lettuce's, the JVM's).
 * </pre>
 */
public final class OverloadDriver {
  private static final Duration LEASE = Duration.ofSeconds(10);

  private OverloadDriver() {}

  /** What the callers saw, counted under one lock. */
  private static final class Tally {
    final ReentrantLock lock = new ReentrantLock();
    final List<Double> lat = new ArrayList<>();
    final List<Double> held = new ArrayList<>();
    int late;
    int inside;
    int maxInside;
    int errors;
    String errorSample = "";

    void granted(double waitedMs, double deadlineMs) {
      lock.lock();
      try {
        lat.add(waitedMs);
        if (waitedMs > deadlineMs) {
          late++;
        }
        inside++;
        maxInside = Math.max(maxInside, inside);
      } finally {
        lock.unlock();
      }
    }

    void left() {
      lock.lock();
      try {
        inside--;
      } finally {
        lock.unlock();
      }
    }

    void released(double heldMs) {
      lock.lock();
      try {
        held.add(heldMs);
      } finally {
        lock.unlock();
      }
    }

    void failed(Throwable e) {
      lock.lock();
      try {
        errors++;
        String s = e.getClass().getSimpleName() + ": " + e.getMessage();
        errorSample = s.length() > 200 ? s.substring(0, 200) : s;
      } finally {
        lock.unlock();
      }
    }
  }

  /** One acquire of the scenario's kind; its hold's release, or empty. */
  private interface Acquirer {
    Optional<Runnable> acquire(Duration wait) throws InterruptedException;

    CompletionStage<Optional<Runnable>> acquireAsync(Duration wait);
  }

  private static Acquirer acquirer(Warden warden, Map<String, String> p, String key) {
    if ("lock".equals(p.get("kind"))) {
      return new Acquirer() {
        @Override
        public Optional<Runnable> acquire(Duration wait) throws InterruptedException {
          return warden.lock(key).lease(LEASE).tryAcquire(wait).map(l -> l::release);
        }

        @Override
        public CompletionStage<Optional<Runnable>> acquireAsync(Duration wait) {
          return warden
              .lock(key)
              .lease(LEASE)
              .tryAcquireAsync(wait)
              .thenApply(o -> o.map(l -> (Runnable) l::release));
        }
      };
    }
    DistributedSemaphore sem = warden.getSemaphore(key, Integer.parseInt(p.get("limit")));
    return new Acquirer() {
      @Override
      public Optional<Runnable> acquire(Duration wait) throws InterruptedException {
        return sem.tryAcquire(1, wait, LEASE).map(h -> h::release);
      }

      @Override
      public CompletionStage<Optional<Runnable>> acquireAsync(Duration wait) {
        return sem.tryAcquireAsync(1, wait, LEASE).thenApply(o -> o.map(h -> h::release));
      }
    };
  }

  private static double ms(long nanos) {
    return nanos / 1e6;
  }

  private static Map<String, Object> overload(
      Warden warden, Map<String, String> p, String key, ExecutorService pool) throws Exception {
    boolean async = p.get("client").endsWith("-async");
    Acquirer acq = acquirer(warden, p, key);
    long holdNanos = TimeUnit.MILLISECONDS.toNanos(Long.parseLong(p.get("hold-ms")));
    long interval = TimeUnit.MILLISECONDS.toNanos(Long.parseLong(p.get("interval-ms")));
    int requests = Integer.parseInt(p.get("requests"));
    double deadlineMs = Double.parseDouble(p.get("deadline-ms"));
    Duration wait = Duration.ofMillis(Long.parseLong(p.get("deadline-ms")));
    Tally tally = new Tally();
    ScheduledExecutorService timer = Executors.newSingleThreadScheduledExecutor();
    List<Future<?>> calls = new ArrayList<>();
    List<CompletableFuture<Void>> asyncCalls = new ArrayList<>();
    long start = System.nanoTime();
    for (int i = 0; i < requests; i++) {
      long due = start + i * interval;
      // Slept, not spun (as the other drivers): a spin would take the CPU the
      // clients and the server share on a small machine.
      long left = due - System.nanoTime();
      if (left > 0) {
        TimeUnit.NANOSECONDS.sleep(left);
      }
      long t0 = System.nanoTime();
      if (async) {
        CompletableFuture<Void> done = new CompletableFuture<>();
        asyncCalls.add(done);
        acq.acquireAsync(wait)
            .whenComplete(
                (got, e) -> {
                  if (e != null) {
                    tally.failed(e);
                    done.complete(null);
                  } else if (!got.isPresent()) {
                    done.complete(null);
                  } else {
                    tally.granted(ms(System.nanoTime() - t0), deadlineMs);
                    // The release blocks: on a pool thread, not the timer's.
                    timer.schedule(
                        () ->
                            pool.execute(
                                () -> {
                                  tally.left();
                                  long t1 = System.nanoTime();
                                  try {
                                    got.get().run();
                                  } catch (RuntimeException re) {
                                    tally.failed(re);
                                  }
                                  tally.released(ms(System.nanoTime() - t1) + ms(holdNanos));
                                  done.complete(null);
                                }),
                        holdNanos,
                        TimeUnit.NANOSECONDS);
                  }
                });
      } else {
        calls.add(
            pool.submit(
                () -> {
                  // From the call, as a request thread would see it (as the Python driver).
                  long called = System.nanoTime();
                  try {
                    Optional<Runnable> got = acq.acquire(wait);
                    if (!got.isPresent()) {
                      return;
                    }
                    tally.granted(ms(System.nanoTime() - called), deadlineMs);
                    long t1 = System.nanoTime();
                    TimeUnit.NANOSECONDS.sleep(holdNanos);
                    tally.left();
                    got.get().run();
                    tally.released(ms(System.nanoTime() - t1));
                  } catch (Exception | Error e) {
                    tally.failed(e);
                  }
                }));
      }
    }
    double span = ms(System.nanoTime() - start);
    for (Future<?> f : calls) {
      f.get();
    }
    for (CompletableFuture<Void> f : asyncCalls) {
      f.get(30, TimeUnit.SECONDS);
    }
    timer.shutdown();
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("span_ms", span);
    out.put("granted", tally.lat.size());
    out.put("late", tally.late);
    out.put("max_inside", tally.maxInside);
    out.put("errors", tally.errors);
    out.put("error_sample", tally.errorSample);
    out.put("lat_ms", tally.lat);
    out.put("held_ms", tally.held);
    return out;
  }

  private static List<Double> burstRound(Map<String, String> p, Tally tally) throws Exception {
    int n = Integer.parseInt(p.get("requests"));
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + p.get("port"));
    StatefulRedisConnection<byte[], byte[]> conn = client.connect(ByteArrayCodec.INSTANCE);
    conn.sync().ping();
    Warden warden = Warden.create(LettuceTransport.create(client, conn));
    Acquirer acq = acquirer(warden, p, p.get("key"));
    List<Double> times = new ArrayList<>();
    ReentrantLock timesLock = new ReentrantLock();
    CyclicBarrier gate = new CyclicBarrier(n + 1);
    CountDownLatch allIn = new CountDownLatch(n);
    long[] start = new long[1];
    List<Thread> threads = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      Thread t =
          new Thread(
              () -> {
                Optional<Runnable> got = Optional.empty();
                try {
                  gate.await();
                  got = acq.acquire(Duration.ofSeconds(5));
                  if (!got.isPresent()) {
                    throw new IllegalStateException("not granted in 5 s");
                  }
                  double at = ms(System.nanoTime() - start[0]);
                  timesLock.lock();
                  try {
                    times.add(at);
                  } finally {
                    timesLock.unlock();
                  }
                } catch (Exception e) {
                  tally.failed(e);
                }
                allIn.countDown();
                try {
                  allIn.await();
                } catch (InterruptedException e) {
                  Thread.currentThread().interrupt();
                }
                got.ifPresent(Runnable::run);
              });
      t.start();
      threads.add(t);
    }
    start[0] = System.nanoTime();
    gate.await();
    for (Thread t : threads) {
      t.join();
    }
    warden.close();
    conn.close();
    client.shutdown(0, 1, TimeUnit.SECONDS);
    return times;
  }

  private static Map<String, Object> burst(Map<String, String> p) throws Exception {
    Tally tally = new Tally();
    burstRound(p, new Tally()); // warm-up, unmeasured
    List<Double> first = new ArrayList<>();
    List<Double> all = new ArrayList<>();
    for (int r = 0; r < Integer.parseInt(p.get("rounds")); r++) {
      List<Double> times = burstRound(p, tally);
      if (!times.isEmpty()) {
        first.add(times.stream().min(Double::compare).get());
        all.add(times.stream().max(Double::compare).get());
      }
    }
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("first_ms", first);
    out.put("all_ms", all);
    out.put("errors", tally.errors);
    out.put("error_sample", tally.errorSample);
    return out;
  }

  private static String json(Object v) {
    if (v instanceof Map) {
      StringBuilder sb = new StringBuilder("{");
      for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
        if (sb.length() > 1) {
          sb.append(", ");
        }
        sb.append(json(String.valueOf(e.getKey()))).append(": ").append(json(e.getValue()));
      }
      return sb.append('}').toString();
    }
    if (v instanceof List) {
      StringBuilder sb = new StringBuilder("[");
      for (Object x : (List<?>) v) {
        if (sb.length() > 1) {
          sb.append(", ");
        }
        sb.append(json(x));
      }
      return sb.append(']').toString();
    }
    if (v instanceof Number) {
      return v.toString();
    }
    String s = String.valueOf(v);
    StringBuilder sb = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      if (c == '"' || c == '\\') {
        sb.append('\\').append(c);
      } else if (c < 0x20) {
        sb.append(String.format("\\u%04x", (int) c));
      } else {
        sb.append(c);
      }
    }
    return sb.append('"').toString();
  }

  public static void main(String[] args) throws Exception {
    if (args.length == 1 && "--version".equals(args[0])) {
      Map<String, Object> v = new LinkedHashMap<>();
      Package own = Warden.class.getPackage();
      v.put(
          "warden (Java)",
          own.getImplementationVersion() == null ? "1.1.0" : own.getImplementationVersion());
      v.put("lettuce", io.lettuce.core.LettuceVersion.getVersion());
      v.put("java", System.getProperty("java.version"));
      System.out.println(json(v));
      return;
    }
    Map<String, String> p = new LinkedHashMap<>();
    for (int i = 0; i + 1 < args.length; i += 2) {
      p.put(args[i].replaceFirst("^--", ""), args[i + 1]);
    }
    Map<String, Object> out;
    if ("burst".equals(p.get("scenario"))) {
      out = burst(p);
    } else {
      RedisClient client = RedisClient.create("redis://127.0.0.1:" + p.get("port"));
      Warden warden = Warden.create(LettuceTransport.create(client));
      ExecutorService pool = Executors.newCachedThreadPool();
      overload(warden, p, p.get("key") + ":warm-up", pool);
      Thread.sleep(100);
      out = overload(warden, p, p.get("key"), pool);
      pool.shutdown();
      warden.close();
      client.shutdown(0, 1, TimeUnit.SECONDS);
    }
    System.out.println(json(out));
    System.exit(0);
  }
}
