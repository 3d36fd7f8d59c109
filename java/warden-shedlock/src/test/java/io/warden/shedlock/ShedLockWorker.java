package io.warden.shedlock;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.time.Instant;
import net.javacrumbs.shedlock.core.DefaultLockingTaskExecutor;
import net.javacrumbs.shedlock.core.LockConfiguration;
import net.javacrumbs.shedlock.core.LockProvider;
import net.javacrumbs.shedlock.core.LockingTaskExecutor;

/**
 * One JVM of {@link ShedLockAcrossJvmsTest}: says {@code ready}, reads the start (epoch ms) from
 * its standard input, then for {@code windowMs} a scheduler's tick every {@code tickMs} runs the
 * ShedLock page's block, its job taking {@code jobMs} (a tick missed while the job ran is skipped,
 * as a scheduler's would be). Prints {@code ran <pid>} for each run and {@code ticks <n>} at the
 * end.
 *
 * <p>Arguments: port name windowMs tickMs lockAtMostForMs lockAtLeastForMs jobMs
 */
public final class ShedLockWorker {
  private ShedLockWorker() {}

  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    String name = args[1];
    long windowMs = Long.parseLong(args[2]);
    long tickMs = Long.parseLong(args[3]);
    Duration atMost = Duration.ofMillis(Long.parseLong(args[4]));
    Duration atLeast = Duration.ofMillis(Long.parseLong(args[5]));
    long jobMs = Long.parseLong(args[6]);
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
    int ticks = 0;
    try (Warden warden = Warden.create(LettuceTransport.create(client))) {
      LockProvider lockProvider = new WardenLockProvider(warden);
      LockingTaskExecutor executor = new DefaultLockingTaskExecutor(lockProvider);
      System.out.println("ready");
      System.out.flush();
      BufferedReader in =
          new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
      long startAt = Long.parseLong(in.readLine().trim());
      for (long tick = startAt; tick < startAt + windowMs; tick += tickMs) {
        long late = System.currentTimeMillis() - tick;
        if (late > tickMs) {
          continue;
        }
        Thread.sleep(Math.max(0, -late));
        ticks++;
        executor.executeWithLock(
            (Runnable) () -> job(jobMs),
            new LockConfiguration(Instant.now(), name, atMost, atLeast));
      }
    } finally {
      client.shutdown();
    }
    System.out.println("ticks " + ticks);
  }

  private static void job(long ms) {
    System.out.println("ran " + ProcessHandle.current().pid());
    System.out.flush();
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }
}
