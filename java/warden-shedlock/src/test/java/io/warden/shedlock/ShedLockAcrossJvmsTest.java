package io.warden.shedlock;

import static org.assertj.core.api.Assertions.assertThat;

import io.warden.testing.RedisServer;
import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * The ShedLock page's example across 3 JVMs on a server capped as {@code redis.conf.example} is: a
 * job longer than {@code warden.max-lease}, its {@code lockAtMostFor} longer still, runs exactly
 * once while every JVM's scheduler keeps ticking, its lock renewed within the cap throughout.
 *
 * <p>{@code make test} runs it scaled down (max-lease 1 s, job 3 s, lockAtMostFor 10 s,
 * lockAtLeastFor 1 s, a tick every 200 ms); {@code make java-shedlock-10m} runs the page's own
 * figures ({@code -Dwarden.shedlock.literal=true}: max-lease 30 s and grace 41 s as in
 * redis.conf.example, job 2 min, lockAtMostFor 10 min, lockAtLeastFor 1 min, a tick every 5 s;
 * about 3 minutes, the grace window first).
 */
@Tag("integration")
class ShedLockAcrossJvmsTest {
  private static final int JVMS = 3;
  private static final boolean LITERAL = Boolean.getBoolean("warden.shedlock.literal");

  private static ProcessBuilder worker(List<String> args) {
    String java =
        System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
    String classPath =
        System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    List<String> command =
        new ArrayList<>(
            Arrays.asList(java, "-Xmx128m", "-cp", classPath, ShedLockWorker.class.getName()));
    command.addAll(args);
    return new ProcessBuilder(command).redirectErrorStream(true);
  }

  /** Starts a worker whose output lines are collected; {@code ready} counts down. */
  private static Process start(List<String> args, List<String> lines, CountDownLatch ready)
      throws IOException {
    Process p = worker(args).start();
    Thread reader =
        new Thread(
            () -> {
              try (BufferedReader r =
                  new BufferedReader(
                      new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
                for (String line = r.readLine(); line != null; line = r.readLine()) {
                  lines.add(line);
                  if (line.equals("ready")) {
                    ready.countDown();
                  }
                }
              } catch (IOException e) {
                lines.add("read failed: " + e);
              }
            });
    reader.setDaemon(true);
    reader.start();
    return p;
  }

  @Test
  void aJobLongerThanMaxLeaseRunsOnceAcrossThreeJvms() throws Exception {
    long maxLease = LITERAL ? 30_000 : 1_000;
    long grace = LITERAL ? 41_000 : 0;
    long job = LITERAL ? 120_000 : 3_000;
    long atMost = LITERAL ? 600_000 : 10_000;
    long atLeast = LITERAL ? 60_000 : 1_000;
    long tick = LITERAL ? 5_000 : 200;
    try (RedisServer server =
        RedisServer.start(
            "--warden.max-lease",
            Long.toString(maxLease),
            "--warden.grace",
            Long.toString(grace))) {
      String name = "report-" + UUID.randomUUID();
      String key = "shedlock:" + name;
      // Every JVM ticks until just before the job ends: a lock that lapsed at max-lease would let
      // a later tick run the job a second time.
      List<String> args =
          Arrays.asList(
              Integer.toString(server.port()),
              name,
              Long.toString(job - 2 * tick),
              Long.toString(tick),
              Long.toString(atMost),
              Long.toString(atLeast),
              Long.toString(job));
      List<Process> children = new ArrayList<>();
      List<List<String>> outputs = new ArrayList<>();
      CountDownLatch ready = new CountDownLatch(JVMS);
      long maxPttl = 0;
      int samples = 0;
      int heldSamples = 0;
      try {
        for (int i = 0; i < JVMS; i++) {
          List<String> lines = Collections.synchronizedList(new ArrayList<>());
          outputs.add(lines);
          children.add(start(args, lines, ready));
        }
        assertThat(ready.await(120, TimeUnit.SECONDS)).as("workers ready: %s", outputs).isTrue();
        // redis.conf.example's grace window: no new holder for 41 s after the server's start.
        long graceEnd = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(grace + 5_000);
        while (server.wardenInfo("grace_remaining_ms") > 0 && System.nanoTime() - graceEnd < 0) {
          Thread.sleep(100);
        }
        // One tick for all, as a cron expression fires on every instance at once.
        long startAt = System.currentTimeMillis() + 200;
        for (Process p : children) {
          p.getOutputStream().write((startAt + "\n").getBytes(StandardCharsets.UTF_8));
          p.getOutputStream().flush();
        }
        // The lock as the server sees it, while the job should run.
        Thread.sleep(Math.max(0, startAt + tick - System.currentTimeMillis()));
        while (System.currentTimeMillis() < startAt + job - tick) {
          long pttl = (Long) server.call("PTTL", key);
          samples++;
          if (pttl > 0) {
            heldSamples++;
            maxPttl = Math.max(maxPttl, pttl);
          }
          Thread.sleep(Math.max(10, tick / 2));
        }
        int runs = 0;
        long ticks = 0;
        for (int i = 0; i < JVMS; i++) {
          Process p = children.get(i);
          assertThat(p.waitFor(job / 1000 + 120, TimeUnit.SECONDS)).isTrue();
          assertThat(p.exitValue()).as("worker %d: %s", i, outputs.get(i)).isZero();
        }
        Thread.sleep(100); // the readers reach the end of each output
        for (List<String> out : outputs) {
          synchronized (out) {
            for (String line : out) {
              if (line.startsWith("ran ")) {
                runs++;
              } else if (line.startsWith("ticks ")) {
                ticks += Long.parseLong(line.substring(6).trim());
              }
            }
          }
        }
        System.out.printf(
            "ShedLock across %d JVMs, max-lease %d ms: %d ticks, %d run(s) of a %d ms job"
                + " (lockAtMostFor %d ms); held at %d of %d samples, PTTL at most %d ms%n",
            JVMS, maxLease, ticks, runs, job, atMost, heldSamples, samples, maxPttl);
        assertThat(runs).as("runs: %s", outputs).isEqualTo(1);
        assertThat(ticks).isGreaterThan(JVMS);
        assertThat(heldSamples).isEqualTo(samples);
        assertThat(maxPttl).isLessThanOrEqualTo(maxLease);
      } finally {
        children.forEach(Process::destroyForcibly);
      }
    }
  }
}
