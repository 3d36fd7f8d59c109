package io.warden.lettuce;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.WardenLock;
import io.warden.testing.RedisServer;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** Exclusion and crash recovery across JVMs: separate processes, one server. */
class ExclusionAcrossJvmsTest {
  private static final int JVMS = 4;
  private static final int THREADS = 50;
  private static final int PER_THREAD = 500;
  private static final int KEYS = 8;

  private static ProcessBuilder worker(String... args) {
    String java =
        System.getProperty("java.home") + File.separator + "bin" + File.separator + "java";
    String classPath =
        System.getProperty("surefire.test.class.path", System.getProperty("java.class.path"));
    List<String> command =
        new ArrayList<>(
            Arrays.asList(java, "-Xmx256m", "-cp", classPath, ExclusionWorker.class.getName()));
    command.addAll(Arrays.asList(args));
    return new ProcessBuilder(command).redirectErrorStream(true);
  }

  private static String text(Object reply) {
    return reply == null ? null : new String((byte[]) reply, StandardCharsets.UTF_8);
  }

  /** 4 JVMs x 50 threads, 10^5 holds on 8 keys: never two inside, fences always rising. */
  @Test
  void fourJvmsOfFiftyThreadsNeverOverlap() throws Exception {
    try (RedisServer server = RedisServer.start()) {
      String run = "x" + UUID.randomUUID();
      List<Process> children = new ArrayList<>();
      List<File> logs = new ArrayList<>();
      try {
        for (int i = 0; i < JVMS; i++) {
          File log = File.createTempFile("exclusion-worker-", ".log");
          log.deleteOnExit();
          logs.add(log);
          children.add(
              worker(
                      String.valueOf(server.port()),
                      run,
                      String.valueOf(THREADS),
                      String.valueOf(PER_THREAD),
                      String.valueOf(KEYS))
                  .redirectOutput(log)
                  .start());
        }
        for (int i = 0; i < JVMS; i++) {
          Process p = children.get(i);
          String out = "";
          boolean done = p.waitFor(600, TimeUnit.SECONDS);
          out = new String(Files.readAllBytes(logs.get(i).toPath()), StandardCharsets.UTF_8);
          assertTrue(done, "worker " + i + " finished: " + out);
          assertEquals(0, p.exitValue(), "worker " + i + ": " + out);
        }
      } finally {
        children.forEach(Process::destroyForcibly);
      }
      long acquired = Long.parseLong(text(server.call("HGET", run + ":counts", "acquired")));
      String violations = text(server.call("HGET", run + ":counts", "violations"));
      System.out.printf(
          "%d JVMs x %d threads on %d keys: %d holds, %s overlaps or fence regressions%n",
          JVMS, THREADS, KEYS, acquired, violations == null ? "0" : violations);
      assertEquals((long) JVMS * THREADS * PER_THREAD, acquired);
      assertEquals(null, violations, "two holders at once, or a fence that did not rise");
      assertEquals(0L, server.wardenInfo("waiting_clients"));
    }
  }

  /**
   * kill -9 of the holder's JVM: the waiter is granted when the dead holder's lease ends, not
   * before (asserted, with the measurement's own slack) and not long after (printed).
   */
  @Test
  void killNineOfTheHoldersJvmGrantsTheWaiterAtLeaseEnd() throws Exception {
    long leaseMs = 2000;
    try (RedisServer server = RedisServer.start()) {
      String key = "crash:" + UUID.randomUUID();
      Process holder =
          worker("hold", String.valueOf(server.port()), key, String.valueOf(leaseMs)).start();
      RedisClient client = RedisClient.create(server.uri());
      try (Warden warden = Warden.create(LettuceTransport.create(client))) {
        BufferedReader out =
            new BufferedReader(
                new InputStreamReader(holder.getInputStream(), StandardCharsets.UTF_8));
        String line = out.readLine();
        while (line != null && !line.startsWith("held ")) {
          line = out.readLine(); // the child's logging (SLF4J) comes first
        }
        assertTrue(line != null && line.startsWith("held "), "the holder said: " + line);
        long deadFence = Long.parseLong(line.substring(5));
        holder.destroyForcibly().waitFor(30, TimeUnit.SECONDS);
        // The lease's end as the server sees it, read after the kill.
        long before = System.nanoTime();
        List<?> info = (List<?>) server.call("LOCK.INFO", key);
        long leaseEnd = before + TimeUnit.MILLISECONDS.toNanos(ttlOf(info));
        Optional<WardenLock> next =
            warden
                .lock(key)
                .lease(Duration.ofSeconds(5))
                .tryAcquire(Duration.ofMillis(leaseMs + 10_000));
        long granted = System.nanoTime();
        assertTrue(next.isPresent(), "the waiter was granted");
        long lateMs = TimeUnit.NANOSECONDS.toMillis(granted - leaseEnd);
        System.out.printf(
            "kill -9 of the holder: the waiter granted %+d ms after the lease end%n", lateMs);
        // Never before the dead holder's lease ended (50 ms: the reading's own round trip).
        assertTrue(lateMs >= -50, "granted " + lateMs + " ms after the lease end");
        assertTrue(next.get().fence() > deadFence, "the fence rose");
        next.get().release();
      } finally {
        holder.destroyForcibly();
        client.shutdown();
      }
    }
  }

  /** The remaining lease (ms) in a LOCK.INFO reply (RESP2: field, value, ...). */
  private static long ttlOf(List<?> info) {
    for (int i = 0; i + 1 < info.size(); i += 2) {
      String field = text(info.get(i));
      if (field.equals("ttl") || field.equals("pttl")) {
        return (Long) info.get(i + 1);
      }
    }
    throw new AssertionError("no ttl in LOCK.INFO: " + info);
  }
}
