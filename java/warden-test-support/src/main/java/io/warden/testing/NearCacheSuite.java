package io.warden.testing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import io.warden.NearCache;
import io.warden.TrackingConnection;
import io.warden.Transport;
import io.warden.WaitConnection;
import io.warden.Warden;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.BooleanSupplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;

/** The near cache's contract ({@code docs/cache.md}, "Near cache"), run once per transport. */
public abstract class NearCacheSuite extends TransportSuite {
  private static final Duration TTL = Duration.ofMinutes(5);

  private NearCache open(NearCache.Builder b) {
    NearCache near = b.build();
    await("the tracking connection", () -> near.trackingClientId() > 0);
    return near;
  }

  private NearCache open() {
    return open(NearCache.builder(warden));
  }

  private static void await(String what, BooleanSupplier done) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
    while (!done.getAsBoolean()) {
      if (System.nanoTime() > end) {
        throw new AssertionError("timed out waiting for " + what);
      }
      sleep(2);
    }
  }

  private long calls(String command) {
    Matcher m =
        Pattern.compile("(?m)^cmdstat_" + Pattern.quote(command) + ":calls=(\\d+)")
            .matcher(server.info("commandstats"));
    return m.find() ? Long.parseLong(m.group(1)) : 0;
  }

  private static Callable<String> value(String v, AtomicInteger loads) {
    return () -> {
      loads.incrementAndGet();
      return v;
    };
  }

  /** Filled on the server, then peeked and kept here. */
  private void fillAndKeep(NearCache near, String key, String v) throws Exception {
    AtomicInteger loads = new AtomicInteger();
    assertEquals(v, near.getOrLoadString(key, TTL, value(v, loads)));
    // The fill's invalidation (the miss's peek tracked the key) is applied before the next peek,
    // which then keeps the value.
    near.sync();
    assertEquals(v, near.getOrLoadString(key, TTL, value("other", loads)));
    assertEquals(1, loads.get());
    long hits = near.stats().hits();
    assertEquals(v, near.getOrLoadString(key, TTL, value("other", loads)));
    assertEquals(hits + 1, near.stats().hits());
  }

  @Test
  void aHitCostsNoRoundTrip() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      long peeks = calls("cache.peek");
      long gets = calls("cache.get");
      long hits = near.stats().hits();
      for (int i = 0; i < 100; i++) {
        assertEquals("v1", near.getOrLoadString(k, TTL, () -> "loaded"));
        assertArrayEquals("v1".getBytes(StandardCharsets.UTF_8), near.getIfPresent(k));
      }
      assertEquals(peeks, calls("cache.peek"));
      assertEquals(gets, calls("cache.get"));
      assertEquals(hits + 200, near.stats().hits());
    }
  }

  /**
   * Prints a hit's latency in this process (median over batches of 1,000 of 10^6 hits) next to a
   * {@code CACHE.GET} hit's round trip (median of 2,000); asserts only that the hits were hits.
   */
  @Test
  void hitLatency() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      for (int i = 0; i < 200_000; i++) {
        near.getIfPresent(k);
      }
      long hits = near.stats().hits();
      long[] batches = new long[1000];
      for (int b = 0; b < batches.length; b++) {
        long t0 = System.nanoTime();
        for (int i = 0; i < 1000; i++) {
          near.getIfPresent(k);
        }
        batches[b] = System.nanoTime() - t0;
      }
      assertEquals(hits + 1_000_000, near.stats().hits());
      byte[][] get = {
        "CACHE.GET".getBytes(StandardCharsets.UTF_8),
        k.getBytes(StandardCharsets.UTF_8),
        "1000".getBytes(StandardCharsets.UTF_8)
      };
      long[] trips = new long[2000];
      for (int i = 0; i < 200; i++) {
        warden.transport().execute(get).toCompletableFuture().get();
      }
      for (int i = 0; i < trips.length; i++) {
        long t0 = System.nanoTime();
        warden.transport().execute(get).toCompletableFuture().get();
        trips[i] = System.nanoTime() - t0;
      }
      java.util.Arrays.sort(batches);
      java.util.Arrays.sort(trips);
      System.out.printf(
          "near-cache hit (%s, %s): median %.3f us per hit over 10^6 hits; CACHE.GET hit round"
              + " trip median %.1f us%n",
          getClass().getSimpleName(),
          server.version(),
          batches[batches.length / 2] / 1000.0 / 1000.0,
          trips[trips.length / 2] / 1000.0);
    }
  }

  @Test
  void everyWriteInvalidates() throws Exception {
    String[][] writes = {
      {"SET", "{k}", "v2"},
      {"DEL", "{k}"},
      {"CACHE.INVALIDATE", "{k}"},
      {"FLUSHALL"},
    };
    try (NearCache near = open()) {
      for (String[] w : writes) {
        String k = key(w[0]);
        fillAndKeep(near, k, "v1");
        Object[] cmd = new Object[w.length];
        for (int i = 0; i < w.length; i++) {
          cmd[i] = w[i].equals("{k}") ? k : w[i];
        }
        long before = near.stats().invalidations() + near.stats().flushes();
        server.call(cmd);
        near.sync();
        assertTrue(near.stats().invalidations() + near.stats().flushes() > before, w[0]);
        AtomicInteger loads = new AtomicInteger();
        String now = near.getOrLoadString(k, TTL, value("v3", loads));
        assertNotEquals("v1", now, w[0]);
      }
    }
  }

  /** Read twice: the second read is a hit. */
  private static void assertKeptAgain(NearCache near, String k, String v) throws Exception {
    assertEquals(v, near.getOrLoadString(k, TTL, () -> "loaded"));
    long hits = near.stats().hits();
    assertEquals(v, near.getOrLoadString(k, TTL, () -> "loaded"));
    assertEquals(hits + 1, near.stats().hits());
  }

  @Test
  void anExpiryOnTheServerInvalidates() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      server.call("PEXPIRE", k, "100");
      near.sync();
      // Kept again, with its new expiry; the server's expiry sends an invalidation of its own.
      assertKeptAgain(near, k, "v1");
      long invalidations = near.stats().invalidations();
      await("the expiry's invalidation", () -> near.stats().invalidations() > invalidations);
      assertEquals(0, near.stats().entries());
    }
  }

  @Test
  void aKeptValueEndsAtItsExpiry() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      AtomicInteger loads = new AtomicInteger();
      near.getOrLoadString(k, Duration.ofMillis(300), value("v1", loads));
      near.sync();
      near.getOrLoadString(k, Duration.ofMillis(300), value("v1", loads));
      assertEquals(1, near.stats().entries());
      await("a load after the expiry", () -> load(near, k, loads) == 2);
    }
  }

  private static int load(NearCache near, String k, AtomicInteger loads) {
    try {
      near.getOrLoadString(k, Duration.ofMillis(300), value("v2", loads));
    } catch (Exception e) {
      throw new AssertionError(e);
    }
    return loads.get();
  }

  @Test
  void aStaleValueIsServedThroughCacheGetAndNotKept() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      server.call("CACHE.INVALIDATE", k, "STALE", "10000");
      near.sync();
      CountDownLatch reloaded = new CountDownLatch(1);
      long gets = calls("cache.get");
      assertEquals(
          "v1",
          near.getOrLoadString(
              k,
              TTL,
              () -> {
                reloaded.countDown();
                return "v2";
              }));
      assertEquals(gets + 1, calls("cache.get"));
      assertTrue(reloaded.await(10, TimeUnit.SECONDS));
      long peeks = calls("cache.peek");
      near.sync();
      assertEquals("v2", near.getOrLoadString(k, TTL, () -> "v3"));
      assertEquals(peeks + 1, calls("cache.peek"));
    }
  }

  @Test
  void oneLoadPerMissAcrossConcurrentCallers() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      AtomicInteger loads = new AtomicInteger();
      ExecutorService pool = Executors.newFixedThreadPool(8);
      try {
        List<Future<String>> got = new ArrayList<>();
        for (int i = 0; i < 8; i++) {
          got.add(
              pool.submit(
                  () ->
                      near.getOrLoadString(
                          k,
                          TTL,
                          () -> {
                            loads.incrementAndGet();
                            Thread.sleep(200);
                            return "v1";
                          })));
        }
        for (Future<String> f : got) {
          assertEquals("v1", f.get(10, TimeUnit.SECONDS));
        }
      } finally {
        pool.shutdownNow();
      }
      assertEquals(1, loads.get());
    }
  }

  @Test
  void entriesAndBytesAreBounded() throws Exception {
    try (NearCache near = open(NearCache.builder(warden).maxEntries(3))) {
      for (int i = 0; i < 5; i++) {
        fillAndKeep(near, key("e" + i), "v" + i);
      }
      assertEquals(3, near.stats().entries());
    }
    char[] forty = new char[40];
    java.util.Arrays.fill(forty, 'x');
    try (NearCache near = open(NearCache.builder(warden).maxBytes(100))) {
      for (int i = 0; i < 5; i++) {
        fillAndKeep(near, key("b" + i), new String(forty));
      }
      assertEquals(2, near.stats().entries());
      assertEquals(80, near.stats().bytes());
      assertNull(near.getIfPresent(key("none")));
    }
  }

  private long trackingIdInClientList() {
    String list = str(server.call("CLIENT", "LIST"));
    for (String line : list.split("\n")) {
      Matcher flags = Pattern.compile(" flags=(\\S*)").matcher(line);
      Matcher id = Pattern.compile("^id=(\\d+)").matcher(line);
      if (flags.find() && flags.group(1).contains("t") && id.find()) {
        return Long.parseLong(id.group(1));
      }
    }
    return -1;
  }

  @Test
  void aKilledTrackingConnectionFlushesAndReconnects() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      long id = near.trackingClientId();
      assertEquals(id, trackingIdInClientList());
      long flushes = near.stats().flushes();
      server.call("CLIENT", "KILL", "ID", Long.toString(id));
      await("the flush", () -> near.stats().flushes() > flushes);
      assertEquals(0, near.stats().entries());
      await("the reconnect", () -> near.trackingClientId() > id);
      assertKeptAgain(near, k, "v1");
    }
  }

  @Test
  void aServerRestartFlushes() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      long flushes = near.stats().flushes();
      server.restart();
      await("the flush", () -> near.stats().flushes() > flushes);
      await("the reconnect", () -> near.trackingClientId() > 0);
      // A pooled transport may lend a connection of the old server first (it fails once).
      await("the server path", () -> serverAnswers(k));
      AtomicInteger loads = new AtomicInteger();
      assertEquals("v2", near.getOrLoadString(k, TTL, value("v2", loads)));
      assertEquals(1, loads.get());
    }
  }

  private boolean serverAnswers(String k) {
    try {
      warden.cache().getIfPresent(k);
      return true;
    } catch (RuntimeException e) {
      return false;
    }
  }

  @Test
  void invalidateDropsTheKeyHereAtOnce() throws Exception {
    try (NearCache near = open()) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      near.invalidate(k);
      assertNull(near.getIfPresent(k));
    }
  }

  @Test
  void closeReleasesTheConnection() throws Exception {
    NearCache near = open();
    assertTrue(trackingIdInClientList() > 0);
    near.close();
    await("the tracking connection to go", () -> trackingIdInClientList() < 0);
    assertFalse(near.trackingClientId() > 0);
  }

  /**
   * The race checker: writers on plain connections, each pair {@code SET k v+1}, {@code GET k} (the
   * server's truth y), {@code sync()}, then near reads x; stale when x &lt; y. Meanwhile the
   * tracking connection is killed and the server restarted. {@code WARDEN_NEAR_RACE_PAIRS} sets the
   * size (default 10,000).
   */
  @Test
  void raceChecker() throws Exception {
    String env = System.getenv("WARDEN_NEAR_RACE_PAIRS");
    int pairs = env == null || env.isEmpty() ? 10_000 : Integer.parseInt(env);
    int writers = 8;
    int keysEach = 3;
    AtomicLong done = new AtomicLong();
    AtomicLong stale = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicInteger kills = new AtomicInteger();
    AtomicInteger restarts = new AtomicInteger();
    try (RedisServer own = RedisServer.start("--appendonly", "yes", "--appendfsync", "everysec");
        Warden w = Warden.create(transport(own));
        NearCache near = NearCache.builder(w).build()) {
      await("the tracking connection", () -> near.trackingClientId() > 0);
      long started = System.nanoTime();
      ExecutorService pool = Executors.newFixedThreadPool(writers + 1);
      List<Future<?>> running = new ArrayList<>();
      for (int t = 0; t < writers; t++) {
        int me = t;
        running.add(
            pool.submit(
                () -> {
                  long[] next = new long[keysEach];
                  RespClient c = null;
                  for (int i = me; i < pairs; i += writers) {
                    String k = "race:" + me + ":" + (i % keysEach);
                    try {
                      if (c == null) {
                        c = own.client();
                      }
                      long v = ++next[i % keysEach];
                      c.call("SET", k, Long.toString(v));
                      long y = Long.parseLong(str(c.call("GET", k)));
                      near.sync();
                      for (int r = 0; r < 3; r++) {
                        byte[] x = near.getIfPresent(k);
                        if (x != null && Long.parseLong(str(x)) < y) {
                          stale.incrementAndGet();
                        }
                      }
                    } catch (IOException | RuntimeException e) {
                      errors.incrementAndGet();
                      sleep(5);
                      if (c != null) {
                        c.close();
                      }
                      c = null;
                    }
                    done.incrementAndGet();
                  }
                  if (c != null) {
                    c.close();
                  }
                  return null;
                }));
      }
      int events = 4;
      for (int e = 1; e <= events; e++) {
        long at = (long) pairs * e / (events + 1);
        while (done.get() < at && !allDone(running)) {
          sleep(1);
        }
        if (allDone(running)) {
          break;
        }
        if (e % 2 == 1) {
          long id = near.trackingClientId();
          if (id > 0) {
            try {
              own.call("CLIENT", "KILL", "ID", Long.toString(id));
              kills.incrementAndGet();
            } catch (RuntimeException gone) {
              // it dropped already
            }
          }
        } else {
          own.restart();
          restarts.incrementAndGet();
        }
        await("the reconnect", () -> near.trackingClientId() > 0);
      }
      for (Future<?> f : running) {
        f.get(5, TimeUnit.MINUTES);
      }
      pool.shutdownNow();
      long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
      NearCache.Stats s = near.stats();
      System.out.println(
          "near-cache race ("
              + own.version()
              + "): pairs="
              + done.get()
              + " stale="
              + stale.get()
              + " errors="
              + errors.get()
              + " hits="
              + s.hits()
              + " flushes="
              + s.flushes()
              + " kills="
              + kills.get()
              + " restarts="
              + restarts.get()
              + " ms="
              + ms);
      assertEquals(pairs, done.get());
      assertEquals(0, stale.get());
      assertTrue(s.hits() > 0);
      assertTrue(s.flushes() >= kills.get() + restarts.get());
    }
  }

  private static boolean allDone(List<Future<?>> running) {
    for (Future<?> f : running) {
      if (!f.isDone()) {
        return false;
      }
    }
    return true;
  }

  private static String str(Object reply) {
    return reply instanceof byte[]
        ? new String((byte[]) reply, StandardCharsets.UTF_8)
        : String.valueOf(reply);
  }

  /**
   * A transport to the master {@code sentinel} names {@code name}, as an application reaches a
   * Sentinel-managed master; null where the transport does not follow Sentinel (the failover
   * checker is skipped then).
   */
  protected Transport sentinelTransport(RedisServer sentinel, String name) {
    return null;
  }

  /** The address Sentinel names for the master {@code name}: {@code [host, port]}. */
  private static List<String> masterOf(RespClient sentinel, String name) throws IOException {
    List<String> out = new ArrayList<>();
    for (Object part : (List<?>) sentinel.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", name)) {
      out.add(str(part));
    }
    return out;
  }

  /**
   * The race checker through a Sentinel failover (a master, its replica, one Sentinel, all real
   * servers): writers follow the master Sentinel names, each pair {@code SET k v+1} (and, until the
   * failover, {@code WAIT 1}: the replica has it, so the failover loses no acknowledged write),
   * {@code GET k} (y), {@code sync()}, then near reads x; stale when x &lt; y. Meanwhile the
   * tracking connection is killed, then {@code SENTINEL FAILOVER} moves the master with the old one
   * still up (it keeps its connections until Sentinel demotes it), then the tracking connection is
   * killed again. A fifth of {@code WARDEN_NEAR_RACE_PAIRS} (2,000 by default): each pair waits for
   * the replica until the failover.
   */
  @Test
  void raceCheckerThroughASentinelFailover() throws Exception {
    String env = System.getenv("WARDEN_NEAR_RACE_PAIRS");
    int pairs = Math.max(1, (env == null || env.isEmpty() ? 10_000 : Integer.parseInt(env)) / 5);
    int writers = 4;
    int keysEach = 3;
    String name = "m";
    AtomicLong done = new AtomicLong();
    AtomicLong stale = new AtomicLong();
    AtomicLong errors = new AtomicLong();
    AtomicInteger kills = new AtomicInteger();
    AtomicBoolean replicated = new AtomicBoolean(true);
    try (RedisServer master = RedisServer.start();
        RedisServer replica = master.startReplica();
        RedisServer sentinel = RedisServer.startSentinel(master, name)) {
      Transport t = sentinelTransport(sentinel, name);
      assumeTrue(t != null, "this transport does not follow Sentinel");
      try (Warden w = Warden.create(t);
          NearCache near = NearCache.builder(w).build();
          RespClient ask = sentinel.client()) {
        await("the tracking connection", () -> near.trackingClientId() > 0);
        await("Sentinel to see the replica", () -> replicasSeen(sentinel, name) == 1);
        long started = System.nanoTime();
        ExecutorService pool = Executors.newFixedThreadPool(writers);
        List<Future<?>> running = new ArrayList<>();
        for (int g = 0; g < writers; g++) {
          int me = g;
          running.add(
              pool.submit(
                  () -> {
                    long[] next = new long[keysEach];
                    try (RespClient s = sentinel.client()) {
                      RespClient[] c = {null};
                      List<String> at = null;
                      for (int i = me; i < pairs; i += writers) {
                        String k = "race:" + me + ":" + (i % keysEach);
                        long v = ++next[i % keysEach];
                        long y = -1;
                        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
                        while (y < 0 && System.nanoTime() < end) {
                          try {
                            List<String> now = masterOf(s, name);
                            if (c[0] == null || !now.equals(at)) {
                              if (c[0] != null) {
                                c[0].close();
                              }
                              c[0] = null;
                              c[0] = new RespClient(now.get(0), Integer.parseInt(now.get(1)));
                              at = now;
                            }
                            c[0].call("SET", k, Long.toString(v));
                            if (replicated.get()) {
                              Object acks = c[0].call("WAIT", "1", "1000");
                              if (!(acks instanceof Long) || (Long) acks < 1) {
                                throw new IOException("WAIT: " + acks);
                              }
                            }
                            y = Long.parseLong(str(c[0].call("GET", k)));
                          } catch (IOException | RuntimeException e) {
                            sleep(20);
                            if (c[0] != null) {
                              c[0].close();
                            }
                            c[0] = null;
                          }
                        }
                        if (y < 0) {
                          errors.incrementAndGet();
                        } else {
                          try {
                            near.sync();
                            for (int r = 0; r < 3; r++) {
                              byte[] x = near.getIfPresent(k);
                              if (x != null && Long.parseLong(str(x)) < y) {
                                stale.incrementAndGet();
                              }
                            }
                          } catch (RuntimeException e) {
                            errors.incrementAndGet();
                          }
                        }
                        done.incrementAndGet();
                      }
                      if (c[0] != null) {
                        c[0].close();
                      }
                    }
                    return null;
                  }));
        }
        // The failover takes a second or two while the pairs go on: the kill after it comes later.
        String[] events = {"kill", "failover", "kill"};
        int[] sixths = {1, 2, 3};
        AtomicReference<String> failedOver = new AtomicReference<>();
        AtomicBoolean moved = new AtomicBoolean();
        for (int e = 0; e < events.length; e++) {
          long at = (long) pairs * sixths[e] / 6;
          while (done.get() < at && !allDone(running)) {
            sleep(1);
          }
          if (allDone(running)) {
            break;
          }
          if (events[e].equals("kill")) {
            long id = near.trackingClientId();
            List<String> m = masterOf(ask, name);
            try (RespClient c = new RespClient(m.get(0), Integer.parseInt(m.get(1)))) {
              // Ids are per server: only the tracking connection on this one.
              Matcher flags =
                  Pattern.compile(" flags=(\\S*)")
                      .matcher(str(c.call("CLIENT", "LIST", "ID", Long.toString(id))));
              if (id > 0 && flags.find() && flags.group(1).contains("t")) {
                c.call("CLIENT", "KILL", "ID", Long.toString(id));
                kills.incrementAndGet();
              }
            } catch (IOException | RuntimeException gone) {
              // dropped already
            }
          } else {
            failOver(ask, name, replica.port());
            replicated.set(false);
            failedOver.set(masterOf(ask, name).get(1));
            // The old master is still up and keeps the tracking connection until Sentinel demotes
            // it: the near cache must move by itself.
            long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
            while (!tracks(replica, near) && System.nanoTime() < end) {
              sleep(2);
            }
            moved.set(tracks(replica, near));
          }
          await("the reconnect", () -> near.trackingClientId() > 0);
        }
        for (Future<?> f : running) {
          f.get(5, TimeUnit.MINUTES);
        }
        pool.shutdownNow();
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - started);
        NearCache.Stats st = near.stats();
        System.out.println(
            "near-cache race through a Sentinel failover ("
                + master.version()
                + "): pairs="
                + done.get()
                + " stale="
                + stale.get()
                + " errors="
                + errors.get()
                + " hits="
                + st.hits()
                + " flushes="
                + st.flushes()
                + " kills="
                + kills.get()
                + " failover="
                + (failedOver.get() != null)
                + " moved="
                + moved.get()
                + " ms="
                + ms);
        assertEquals(pairs, done.get());
        assertEquals(0, stale.get());
        assertEquals(String.valueOf(replica.port()), failedOver.get());
        assertTrue(moved.get(), "the tracking connection on the new master");
        assertTrue(st.hits() > 0);
        // Each kill, and the failover, dropped what was held.
        assertTrue(st.flushes() >= kills.get() + 1);
      }
    }
  }

  /** Whether {@code near}'s tracking connection is one of {@code server}'s clients. */
  private static boolean tracks(RedisServer server, NearCache near) {
    long id = near.trackingClientId();
    if (id <= 0) {
      return false;
    }
    Matcher flags =
        Pattern.compile(" flags=(\\S*)")
            .matcher(str(server.call("CLIENT", "LIST", "ID", Long.toString(id))));
    return flags.find() && flags.group(1).contains("t");
  }

  private static int replicasSeen(RedisServer sentinel, String name) {
    return ((List<?>) sentinel.call("SENTINEL", "REPLICAS", name)).size();
  }

  /**
   * {@code SENTINEL FAILOVER name}, then waits until Sentinel names the replica on {@code port}.
   */
  private static void failOver(RespClient ask, String name, int port) throws IOException {
    // Sentinel lists a replica before it counts it as promotable (fresh INFO, link up):
    // NOGOODSLAVE until then.
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (true) {
      try {
        ask.call("SENTINEL", "FAILOVER", name);
        break;
      } catch (RespClient.RespError e) {
        if (!e.getMessage().contains("NOGOODSLAVE") || System.nanoTime() > end) {
          throw e;
        }
        sleep(100);
      }
    }
    end = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
    while (!masterOf(ask, name).get(1).equals(String.valueOf(port))) {
      if (System.nanoTime() > end) {
        throw new AssertionError("Sentinel never named the replica");
      }
      sleep(50);
    }
  }

  /**
   * A transport whose tracking connections' reader, once {@link #pause} is armed, stops inside the
   * next invalidation of a key before applying it: the push has been read from the socket, not yet
   * applied.
   */
  private static final class PausingTransport implements Transport {
    private final Transport inner;
    private volatile String pauseOn;
    final CountDownLatch paused = new CountDownLatch(1);
    final CountDownLatch resume = new CountDownLatch(1);

    PausingTransport(Transport inner) {
      this.inner = inner;
    }

    void pause(String key) {
      pauseOn = key;
    }

    @Override
    public CompletionStage<Object> execute(byte[]... args) {
      return inner.execute(args);
    }

    @Override
    public CompletionStage<WaitConnection> waitConnection(long deadlineNanos) {
      return inner.waitConnection(deadlineNanos);
    }

    @Override
    public CompletionStage<TrackingConnection> trackingConnection(
        TrackingConnection.Listener listener) {
      return inner.trackingConnection(
          new TrackingConnection.Listener() {
            @Override
            public void invalidated(List<byte[]> keys) {
              String k = pauseOn;
              if (k != null && keys != null) {
                for (byte[] key : keys) {
                  if (k.equals(new String(key, StandardCharsets.UTF_8))) {
                    pauseOn = null;
                    paused.countDown();
                    try {
                      resume.await(10, TimeUnit.SECONDS);
                    } catch (InterruptedException e) {
                      Thread.currentThread().interrupt();
                    }
                  }
                }
              }
              listener.invalidated(keys);
            }

            @Override
            public void dropped(Throwable cause) {
              listener.dropped(cause);
            }
          });
    }

    @Override
    public void close() {
      resume.countDown();
      inner.close();
    }
  }

  /**
   * No hit while a delivered invalidation is unapplied: with the tracking reader holding an
   * invalidation it has read and not applied, a read of its key is not served from memory (it goes
   * to the server, whose answer comes after the invalidation's).
   */
  @Test
  void noHitWhileADeliveredInvalidationIsUnapplied() throws Exception {
    PausingTransport pausing = new PausingTransport(transport(server));
    Warden w = Warden.create(pausing);
    ScheduledExecutorService later = Executors.newSingleThreadScheduledExecutor();
    try (NearCache near = open(NearCache.builder(w))) {
      String k = key("k");
      fillAndKeep(near, k, "v1");
      pausing.pause(k);
      server.call("CACHE.INVALIDATE", k);
      assertTrue(pausing.paused.await(10, TimeUnit.SECONDS), "the invalidation was read");
      // Held in memory, the value would be returned at once; the server's answer comes once the
      // reader goes on.
      later.schedule(pausing.resume::countDown, 200, TimeUnit.MILLISECONDS);
      assertNull(near.getIfPresent(k));
    } finally {
      pausing.resume.countDown();
      later.shutdownNow();
      w.close();
    }
  }
}
