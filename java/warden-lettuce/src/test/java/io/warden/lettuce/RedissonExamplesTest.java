package io.warden.lettuce;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.warden.DistributedLock;
import io.warden.DistributedReadWriteLock;
import io.warden.DistributedSemaphore;
import io.warden.Permit;
import io.warden.Transport;
import io.warden.Warden;
import io.warden.WardenRateLimiter;
import io.warden.testing.RedisServer;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.Test;

/**
 * docs/clients/java-redisson.md and the lease-cap example of docs/clients/java.md: each Java block
 * is a region of this file (between {@code // example: NAME} and {@code // end}), run here on
 * redis.conf.example's {@code warden.max-lease 30000}; each warden line of the Redisson page's
 * table is in one of these regions or in warden-spring's docs examples.
 */
@Tag("integration")
class RedissonExamplesTest {
  private final List<String> log = new ArrayList<>();
  private RedisServer server;

  private void ship(int order) {
    log.add("shipped " + order);
  }

  private void export() {
    // The server's lease is the cap, not the 60 s asked for.
    log.add("export, pttl " + server.call("PTTL", "export"));
  }

  private void read() {
    log.add("read");
  }

  private void write() {
    log.add("write");
  }

  private void call(String what) {
    log.add(what);
  }

  @Test
  void theExamplesRunOnTheProductionCap() throws Exception {
    try (RedisServer s = RedisServer.start("--warden.max-lease", "30000")) {
      server = s;
      RedisClient client = RedisClient.create(s.uri());
      Transport transport = LettuceTransport.create(client);
      try {
        // example: builder
        Warden warden =
            Warden.builder(transport) // Redisson's Config.setLockWatchdogTimeout(30000)
                .watchdogLease(Duration.ofSeconds(30)) // renewed every third: 10 s
                .build();
        // end

        // example: rlock
        DistributedLock lock = warden.getLock("orders:42"); // redisson.getLock("orders:42")
        lock.lock(); // no lease: the watchdog renews it until unlock()
        try {
          ship(42);
        } finally {
          lock.unlock();
        }
        if (lock.tryLock(100, 10, TimeUnit.SECONDS)) { // wait up to 100 s, then hold 10 s
          try {
            ship(43);
          } finally {
            lock.unlock();
          }
        }
        lock.lock(10, TimeUnit.SECONDS); // hold 10 s, no watchdog
        lock.unlock();
        // end

        // example: cap
        DistributedLock job = warden.getLock("export"); // warden.max-lease is 30 s
        if (job.tryLock(100, 60, TimeUnit.SECONDS)) { // granted at 30 s, renewed until 60 s
          try {
            export();
          } finally {
            job.unlock(); // IllegalMonitorStateException if the 60 s ran out first
          }
        }
        // end

        // example: rwlock
        DistributedReadWriteLock catalog = warden.getReadWriteLock("catalog");
        catalog.readLock().lock(); // readers share; a waiting writer goes first
        try {
          read();
        } finally {
          catalog.readLock().unlock();
        }
        if (catalog.writeLock().tryLock(5, 30, TimeUnit.SECONDS)) {
          try {
            write();
          } finally {
            catalog.writeLock().unlock();
          }
        }
        // end

        // example: semaphore
        DistributedSemaphore api = warden.getSemaphore("api", 3); // trySetPermits(3), per call
        Permit permit = api.acquire(1, null); // no lease: renewed until released
        try {
          call("api");
        } finally {
          permit.release();
        }
        // end

        // example: expirable
        Optional<Permit> slot = api.tryAcquire(1, Duration.ofSeconds(100), Duration.ofSeconds(10));
        if (slot.isPresent()) { // redisson's permit id: slot.get().owner()
          try (Permit p = slot.get()) {
            call("api with permit " + p.owner() + ", fence " + p.fence());
          }
        }
        // end
        // example: ratelimiter
        WardenRateLimiter limiter = warden.rateLimiter("partner:api", 10, Duration.ofSeconds(1));
        if (limiter.acquire(1, Duration.ofSeconds(2)).allowed()) { // tryAcquire(1, ofSeconds(2))
          call("partner");
        }
        limiter.acquire(1); // waits in the server's FIFO queue until its token conforms
        if (limiter.tryAcquire(1).allowed()) { // never waits
          call("partner");
        }
        // end
        warden.close();
      } finally {
        client.shutdown();
      }
    }
    assertTrue(log.contains("shipped 42") && log.contains("shipped 43"), log.toString());
    assertTrue(log.contains("read") && log.contains("write"), log.toString());
    String export = log.stream().filter(l -> l.startsWith("export")).findFirst().orElse("");
    long pttl = Long.parseLong(export.substring("export, pttl ".length()));
    assertTrue(pttl > 20_000 && pttl <= 30_000, export);
    assertEquals(2, log.stream().filter(l -> l.startsWith("api")).count(), log.toString());
    assertEquals(2, log.stream().filter(l -> l.equals("partner")).count(), log.toString());
  }

  private static Path root() {
    String r = System.getenv("WARDEN_JAVA_ROOT");
    return (r == null || r.isEmpty() ? Paths.get("..") : Paths.get(r)).resolve("..").normalize();
  }

  private static String read(String path) throws IOException {
    return new String(Files.readAllBytes(root().resolve(path)), StandardCharsets.UTF_8);
  }

  /** Each region of this file, without its indentation. */
  private static List<String> regions() throws IOException {
    List<String> lines =
        Files.readAllLines(
            root()
                .resolve(
                    "java/warden-lettuce/src/test/java/io/warden/lettuce/RedissonExamplesTest.java"),
            StandardCharsets.UTF_8);
    List<String> out = new ArrayList<>();
    for (int i = 0; i < lines.size(); i++) {
      if (!lines.get(i).trim().startsWith("// example: ")) {
        continue;
      }
      int indent = lines.get(i).indexOf('/');
      StringBuilder body = new StringBuilder();
      for (int j = i + 1; !lines.get(j).trim().equals("// end"); j++) {
        String l = lines.get(j);
        body.append(l.length() >= indent ? l.substring(indent) : l.trim()).append('\n');
      }
      out.add(body.toString());
    }
    return out;
  }

  /** The Java blocks of a page. */
  private static List<String> javaBlocks(String page) {
    List<String> out = new ArrayList<>();
    Matcher m = Pattern.compile("```java\n(.*?)```\n", Pattern.DOTALL).matcher(page);
    while (m.find()) {
      out.add(m.group(1));
    }
    return out;
  }

  @Test
  void thePagesShowTheExamplesVerbatim() throws IOException {
    List<String> regions = regions();
    List<String> redisson = javaBlocks(read("docs/clients/java-redisson.md"));
    assertFalse(redisson.isEmpty());
    for (String block : redisson) {
      assertTrue(regions.contains(block), "not an example of RedissonExamplesTest:\n" + block);
    }
    String cap = regions.get(2);
    assertTrue(
        javaBlocks(read("docs/clients/java.md")).contains(cap), "java.md shows the cap:\n" + cap);
  }

  @Test
  void everyWardenLineOfTheTableIsRun() throws IOException {
    String ran =
        String.join("\n", regions())
            + read("java/warden-spring/src/test/java/io/warden/spring/docs/DocsExamples.java");
    String page = read("docs/clients/java-redisson.md");
    int rows = 0;
    for (String line : page.split("\n")) {
      // | Redisson | warden | (header and rule rows have no code)
      String[] cells = line.split("\\|");
      if (!line.startsWith("| `") || cells.length < 3) {
        continue;
      }
      Matcher code = Pattern.compile("`([^`]+)`").matcher(cells[2]);
      while (code.find()) {
        rows++;
        assertTrue(ran.contains(code.group(1)), "not run: " + code.group(1) + " in " + line);
      }
    }
    assertTrue(rows >= 10, rows + " warden lines in the table");
  }
}
