package io.warden.lettuce;

import static java.time.Duration.ofMillis;
import static java.time.Duration.ofMinutes;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.warden.DistributedLock;
import io.warden.DistributedReadWriteLock;
import io.warden.Permit;
import io.warden.RateDecision;
import io.warden.Warden;
import io.warden.WardenLock;
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
import java.util.concurrent.CompletableFuture;
import org.junit.jupiter.api.Test;

/**
 * The Java examples of README.md and docs/clients/java.md: each is a region of this file (between
 * {@code // example: NAME} and {@code // end}), run here and required verbatim in the page.
 */
class ReadmeExamplesTest {
  private final List<String> log = new ArrayList<>();

  private void write(String what, long fence) {
    log.add(what + " " + fence);
  }

  private String loadName(int id) {
    log.add("loaded " + id);
    return "Ada #" + id;
  }

  private void buildReport() {
    log.add("report");
  }

  private void handle(String request) {
    log.add(request);
  }

  @Test
  void readmeAndJavaPageExamplesRunAsShown() throws Exception {
    try (RedisServer server = RedisServer.start()) {
      String url = server.uri();
      RedisClient client = RedisClient.create(url);
      try {
        // example: readme
        Warden warden = Warden.create(LettuceTransport.create(client)); // or JedisTransport
        try (WardenLock lock = warden.lock("invoice:42").lease(Duration.ofSeconds(30)).acquire()) {
          write("invoice 42", lock.fence()); // the store rejects lower fences
        }
        DistributedLock report = warden.getLock("report"); // a Lock, re-entrant per thread
        report.lock(); // no lease: a watchdog renews it until unlock()
        report.unlock();
        Optional<Permit> slot = warden.getSemaphore("api", 3).tryAcquire(1, ofMillis(50), null);
        slot.ifPresent(Permit::release); // empty: not granted within 50 ms
        String name = warden.cache().getOrLoadString("user:42", ofMinutes(5), () -> loadName(42));
        // end
        assertEquals("Ada #42", name);
        assertTrue(slot.isPresent());

        // example: rwlock
        DistributedReadWriteLock doc = warden.getReadWriteLock("doc:1");
        try (WardenLock read = doc.read().lease(Duration.ofSeconds(10)).acquire()) {
          write("read doc 1", read.fence()); // readers share; a writer waits for them
        }
        // end

        // example: async
        CompletableFuture<Optional<WardenLock>> pending =
            warden.lock("job:7").tryAcquireAsync(Duration.ofSeconds(2)).toCompletableFuture();
        pending.cancel(true); // takes the waiter out of the server's queue at once
        // end

        // example: overload
        Optional<Permit> permit =
            warden
                .getSemaphore("db-pool", 3)
                .maxQueue(16) // 16 already waiting: answered at once (empty), not queued
                .tryAcquire(1, Duration.ofMillis(50), Duration.ofSeconds(5));
        if (permit.isPresent()) {
          try (Permit p = permit.get()) {
            handle("request with fence " + p.fence());
          }
        } // else: shed or past the deadline; answer 503
        // end

        // example: ratelimit
        WardenRateLimiter partner = // 10 calls a second, 20 at once after a quiet spell
            warden.rateLimiter("partner:api", 10, Duration.ofSeconds(1)).burst(20);
        RateDecision d = partner.acquire(1, Duration.ofSeconds(2)); // queues on the server, FIFO
        if (d.allowed()) {
          handle("call the partner, " + d.remaining() + " tokens left");
        } else { // its token is more than 2 s away: answered at once, not after 2 s
          handle("429, retry after " + d.retryAfter().toMillis() + " ms");
        }
        RateDecision batch = partner.tryAcquire(5); // never waits
        if (batch.allowed()) {
          partner.refund(2); // 3 were needed: 2 go back
        }
        // end
        assertTrue(log.contains("call the partner, 19 tokens left"), log.toString());
        assertTrue(batch.allowed());

        // example: handle
        WardenLock lease = warden.lock("ledger:9").acquire(); // no lease: renewed every 10 s
        lease.onLost(() -> handle("lost ledger:9: stop writing"));
        CompletableFuture.runAsync(lease::release).join(); // a hold is released from any thread
        // end
        warden.close();
      } finally {
        client.shutdown();
      }
      assertTrue(log.contains("loaded 42"));
    }
  }

  private static Path root() {
    String r = System.getenv("WARDEN_JAVA_ROOT");
    return (r == null || r.isEmpty() ? Paths.get("..") : Paths.get(r)).resolve("..").normalize();
  }

  /** Each region of this file, without its indentation. */
  private static List<String[]> regions() throws IOException {
    Path self =
        root()
            .resolve("java/warden-lettuce/src/test/java/io/warden/lettuce/ReadmeExamplesTest.java");
    List<String> lines = Files.readAllLines(self, StandardCharsets.UTF_8);
    List<String[]> out = new ArrayList<>();
    for (int i = 0; i < lines.size(); i++) {
      String t = lines.get(i).trim();
      if (!t.startsWith("// example: ")) {
        continue;
      }
      String name = t.substring("// example: ".length());
      int indent = lines.get(i).indexOf('/');
      StringBuilder body = new StringBuilder();
      for (int j = i + 1; !lines.get(j).trim().equals("// end"); j++) {
        String l = lines.get(j);
        body.append(l.length() >= indent ? l.substring(indent) : l.trim()).append('\n');
      }
      out.add(new String[] {name, body.toString()});
    }
    return out;
  }

  @Test
  void thePagesShowTheExamplesVerbatim() throws IOException {
    String readme =
        new String(Files.readAllBytes(root().resolve("README.md")), StandardCharsets.UTF_8);
    String page =
        new String(
            Files.readAllBytes(root().resolve("docs/clients/java.md")), StandardCharsets.UTF_8);
    List<String[]> regions = regions();
    assertEquals(6, regions.size());
    for (String[] r : regions) {
      String block = "```java\n" + r[1] + "```\n";
      String where = r[0].equals("readme") ? readme : page;
      assertTrue(where.contains(block), r[0] + " is not shown verbatim:\n" + block);
    }
  }
}
