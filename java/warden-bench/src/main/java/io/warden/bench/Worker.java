package io.warden.bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.lang.management.CompilationMXBean;
import java.lang.management.ManagementFactory;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import org.HdrHistogram.Histogram;

/**
 * One JVM of a run: opens a contender, warms up, prints READY, waits for GO on stdin, runs THREADS
 * threads on one key for the given seconds, prints one RESULT line and exits.
 *
 * <p>Each thread loops: acquire (the wait is recorded), 1 ms inside (Thread.sleep: the box has 2
 * shared cores, a busy-spin would take one from the server), release. Hand-offs are the
 * acquisitions completed inside the window; waits of acquisitions that complete after it are
 * recorded too (leaving them out would hide the slowest ones).
 */
final class Worker {
  private Worker() {}

  /** args: contender threads port key. */
  static void run(String[] args) throws Exception {
    String name = args[0];
    int threads = Integer.parseInt(args[1]);
    int port = Integer.parseInt(args[2]);
    String key = args[3];
    Workload workload = Workload.of(name);

    try (Contender contender = Contenders.open(name, port)) {
      List<Contender.Locker> lockers = new ArrayList<>();
      for (int t = 0; t < threads; t++) {
        lockers.add(contender.locker(key, t));
      }
      // Warm-up: connections opened, scripts loaded, subscriptions made, code compiled. The loop
      // (without the hold) runs until the JIT is done with it: a client whose code takes longer
      // to compile is measured warm, as the others, not while its compiler threads take the cores.
      AtomicBoolean warming = new AtomicBoolean(true);
      Thread[] warm = new Thread[threads];
      CountDownLatch started = new CountDownLatch(threads);
      for (int t = 0; t < threads; t++) {
        Contender.Locker locker = lockers.get(t);
        warm[t] =
            new Thread(
                () -> {
                  boolean counted = false;
                  try {
                    for (int i = 0; i < Bench.WARMUP_ITERATIONS || warming.get(); i++) {
                      locker.acquire();
                      locker.release();
                      if (i == Bench.WARMUP_ITERATIONS - 1) {
                        counted = true;
                        started.countDown();
                      }
                    }
                  } catch (Exception e) {
                    throw new IllegalStateException(e);
                  } finally {
                    if (!counted) {
                      started.countDown();
                    }
                  }
                });
        warm[t].start();
      }
      started.await();
      awaitCompiled();
      warming.set(false);
      for (Thread t : warm) {
        t.join();
      }
      System.out.println("READY");
      System.out.flush();
      BufferedReader in =
          new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      // One slice per "GO seconds": the harness runs every contender's slices in turn, so a
      // burst of other work on the machine falls on all of them alike.
      for (String cmd; (cmd = in.readLine()) != null && cmd.startsWith("GO "); ) {
        System.out.println(slice(lockers, workload, Double.parseDouble(cmd.substring(3))));
        System.out.flush();
      }
    }
  }

  /**
   * Returns once the JIT compiled for less than {@link Bench#WARMUP_COMPILE_SHARE} of a second over
   * the last second, or after {@link Bench#WARMUP_MAX_S}.
   */
  static void awaitCompiled() throws InterruptedException {
    CompilationMXBean jit = ManagementFactory.getCompilationMXBean();
    if (jit == null || !jit.isCompilationTimeMonitoringSupported()) {
      Thread.sleep((long) (Bench.WARMUP_MAX_S * 1000));
      return;
    }
    long end = System.nanoTime() + (long) (Bench.WARMUP_MAX_S * 1e9);
    long before = jit.getTotalCompilationTime();
    while (System.nanoTime() < end) {
      Thread.sleep(1000);
      long now = jit.getTotalCompilationTime();
      if (now - before < Bench.WARMUP_COMPILE_SHARE * 1000) {
        return;
      }
      before = now;
    }
  }

  /** One window of the loop on every thread; its RESULT line. */
  private static String slice(List<Contender.Locker> lockers, Workload workload, double seconds)
      throws InterruptedException {
    int threads = lockers.size();
    long start = System.nanoTime();
    long end = start + (long) (seconds * 1e9);
    long[] counts = new long[threads];
    Histogram[] waits = new Histogram[threads];
    AtomicInteger writers = new AtomicInteger();
    AtomicInteger inside = new AtomicInteger();
    AtomicLong overlaps = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicLong heldNanos = new AtomicLong();
    AtomicLong heldCount = new AtomicLong();
    AtomicReference<String> firstError = new AtomicReference<>("");
    CountDownLatch done = new CountDownLatch(threads);
    for (int t = 0; t < threads; t++) {
      int me = t;
      Contender.Locker locker = lockers.get(t);
      waits[t] = new Histogram(3_600_000_000L, 3);
      new Thread(
              () -> {
                try {
                  while (System.nanoTime() < end) {
                    long t0 = System.nanoTime();
                    try {
                      locker.acquire();
                    } catch (Exception e) {
                      errors.incrementAndGet();
                      firstError.compareAndSet("", e.toString());
                      continue;
                    }
                    long t1 = System.nanoTime();
                    boolean write = workload.exclusive(locker);
                    int in1 = inside.incrementAndGet();
                    int w = write ? writers.incrementAndGet() : writers.get();
                    if (in1 > workload.limit
                        || (write && (w > 1 || in1 > 1))
                        || (!write && w > 0)) {
                      overlaps.incrementAndGet();
                    }
                    Thread.sleep(Bench.HOLD_MS);
                    if (write) {
                      writers.decrementAndGet();
                    }
                    inside.decrementAndGet();
                    heldNanos.addAndGet(System.nanoTime() - t1);
                    heldCount.incrementAndGet();
                    try {
                      locker.release();
                    } catch (Exception e) {
                      errors.incrementAndGet();
                      firstError.compareAndSet("", e.toString());
                    }
                    waits[me].recordValue(Math.max(1, (t1 - t0) / 1000));
                    if (t1 <= end) {
                      counts[me]++;
                    }
                  }
                } catch (InterruptedException e) {
                  Thread.currentThread().interrupt();
                } finally {
                  done.countDown();
                }
              })
          .start();
    }
    done.await();
    Histogram all = new Histogram(3_600_000_000L, 3);
    for (Histogram h : waits) {
      all.add(h);
    }
    StringBuilder line = new StringBuilder("RESULT counts=");
    for (int t = 0; t < threads; t++) {
      line.append(t == 0 ? "" : ",").append(counts[t]);
    }
    line.append(" overlaps=").append(overlaps.get());
    line.append(" errors=").append(errors.get());
    line.append(" held_ns=").append(heldNanos.get() / Math.max(1, heldCount.get()));
    line.append(" hist=").append(encode(all));
    line.append(" error=").append(firstError.get().replaceAll("\\s+", "_"));
    return line.toString();
  }

  /** args: contender iterations port key. One thread, acquire + release on a free key. */
  static void uncontended(String[] args) throws Exception {
    String name = args[0];
    int iterations = Integer.parseInt(args[1]);
    int port = Integer.parseInt(args[2]);
    String key = args[3];
    try (Contender contender = Contenders.open(name, port)) {
      Contender.Locker warm = contender.locker(key + "-warm", 0);
      for (int i = 0; i < Bench.WARMUP_ITERATIONS; i++) {
        warm.acquire();
        warm.release();
      }
      Contender.Locker locker = contender.locker(key, 0);
      System.out.println("READY");
      System.out.flush();
      BufferedReader in =
          new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      if (!"GO".equals(in.readLine())) {
        return;
      }
      for (int i = 0; i < iterations; i++) {
        locker.acquire();
        locker.release();
      }
      System.out.println("DONE");
      System.out.flush();
      in.readLine(); // the harness closes stdin once it has counted
    }
  }

  /** args: contender count port key. count virtual threads, each acquire + release once. */
  static void virtualThreads(String[] args) throws Exception {
    String name = args[0];
    int count = Integer.parseInt(args[1]);
    int port = Integer.parseInt(args[2]);
    String key = args[3];
    try (Contender contender = Contenders.open(name, port)) {
      Contender.Locker warm = contender.locker(key + "-warm", 0);
      warm.acquire();
      warm.release();
      AtomicLong completed = new AtomicLong();
      AtomicLong errors = new AtomicLong();
      AtomicReference<String> firstError = new AtomicReference<>("");
      long t0 = System.nanoTime();
      try (var executor = java.util.concurrent.Executors.newVirtualThreadPerTaskExecutor()) {
        for (int i = 0; i < count; i++) {
          int me = i;
          executor.submit(
              () -> {
                try {
                  Contender.Locker locker = contender.locker(key, me);
                  locker.acquire();
                  locker.release();
                  completed.incrementAndGet();
                } catch (Exception e) {
                  errors.incrementAndGet();
                  firstError.compareAndSet("", e.toString());
                }
              });
        }
      }
      double seconds = (System.nanoTime() - t0) / 1e9;
      System.out.println(
          "RESULT completed="
              + completed.get()
              + " seconds="
              + seconds
              + " errors="
              + errors.get()
              + " error="
              + firstError.get().replaceAll("\\s+", "_"));
      System.out.flush();
    }
  }

  static String encode(Histogram h) {
    ByteBuffer buf = ByteBuffer.allocate(h.getNeededByteBufferCapacity());
    int n = h.encodeIntoCompressedByteBuffer(buf);
    byte[] bytes = new byte[n];
    buf.flip();
    buf.get(bytes);
    return Base64.getEncoder().encodeToString(bytes);
  }

  static Histogram decode(String s) throws Exception {
    return Histogram.decodeFromCompressedByteBuffer(
        ByteBuffer.wrap(Base64.getDecoder().decode(s)), 0);
  }

  /**
   * The bound a workload keeps: a lock 1 holder, a semaphore its limit, a read-write lock one
   * writer.
   */
  enum Workload {
    LOCK(1),
    SEM(Bench.SEM_LIMIT),
    RW(Integer.MAX_VALUE);

    final int limit;

    Workload(int limit) {
      this.limit = limit;
    }

    static Workload of(String contender) {
      return contender.endsWith("-sem") ? SEM : contender.endsWith("-rw") ? RW : LOCK;
    }

    boolean exclusive(Contender.Locker locker) {
      return this == LOCK || (this == RW && ((Incumbents.Alternating) locker).writing());
    }
  }
}
