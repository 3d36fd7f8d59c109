package io.warden.lettuce;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.WardenException;
import io.warden.testing.RedisServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Tag;
import org.junit.jupiter.api.TestInstance;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * What the transport's connections deliver: a command is sent at most once (a connection that drops
 * with an acquire unanswered never sends it again, so no second hold or permit appears), and a
 * cache lease won on a waiter connection lives until it is filled.
 */
@Tag("integration")
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class LettuceDeliveryTest {
  private RedisServer server;

  @BeforeAll
  void start() {
    server = RedisServer.start();
  }

  @AfterAll
  void stop() {
    server.close();
  }

  /** A TCP proxy to the server that can drop a connection in place of the next reply. */
  private static final class Proxy implements AutoCloseable {
    final ServerSocket listener;
    final AtomicBoolean dropNextReply = new AtomicBoolean();
    final CopyOnWriteArrayList<Socket> sockets = new CopyOnWriteArrayList<>();

    Proxy(int serverPort) throws IOException {
      listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
      Thread accept =
          new Thread(
              () -> {
                while (!listener.isClosed()) {
                  try {
                    Socket client = listener.accept();
                    Socket upstream = new Socket(InetAddress.getLoopbackAddress(), serverPort);
                    client.setTcpNoDelay(true);
                    upstream.setTcpNoDelay(true);
                    sockets.add(client);
                    sockets.add(upstream);
                    pump(client, upstream, false);
                    pump(upstream, client, true);
                  } catch (IOException e) {
                    return;
                  }
                }
              });
      accept.setDaemon(true);
      accept.start();
    }

    private void pump(Socket from, Socket to, boolean replies) {
      Thread t =
          new Thread(
              () -> {
                byte[] buf = new byte[16384];
                try (InputStream in = from.getInputStream();
                    OutputStream out = to.getOutputStream()) {
                  int n;
                  while ((n = in.read(buf)) > 0) {
                    if (replies && dropNextReply.compareAndSet(true, false)) {
                      // The server has run the command; its client never reads the reply.
                      from.close();
                      to.close();
                      return;
                    }
                    out.write(buf, 0, n);
                    out.flush();
                  }
                } catch (IOException e) {
                  // closed
                } finally {
                  closeQuietly(from);
                  closeQuietly(to);
                }
              });
      t.setDaemon(true);
      t.start();
    }

    private static void closeQuietly(Socket s) {
      try {
        s.close();
      } catch (IOException e) {
        // closed
      }
    }

    int port() {
      return listener.getLocalPort();
    }

    @Override
    public void close() throws IOException {
      listener.close();
      for (Socket s : sockets) {
        closeQuietly(s);
      }
    }
  }

  private void awaitFree(String key, String infoCommand) {
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(3);
    while (server.call(infoCommand, key) != null && System.nanoTime() < end) {
      sleep(10);
    }
    assertNull(server.call(infoCommand, key), key + " still held: a command was sent twice");
    assertEquals(0, server.wardenInfo("waiting_clients"), "clients still waiting");
  }

  private static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /** One acquire of {@code kind} (lock / sem) through {@code warden}, released if granted. */
  private static void acquireOnce(Warden warden, String kind, String key, Duration wait)
      throws Exception {
    if ("lock".equals(kind)) {
      warden
          .lock(key)
          .lease(Duration.ofSeconds(30))
          .tryAcquire(wait)
          .ifPresent(io.warden.WardenLock::release);
    } else {
      warden
          .getSemaphore(key, 2)
          .tryAcquire(1, wait, Duration.ofSeconds(30))
          .ifPresent(io.warden.Permit::release);
    }
  }

  private static String info(String kind) {
    return "lock".equals(kind) ? "LOCK.INFO" : "SEM.INFO";
  }

  @ParameterizedTest
  @ValueSource(strings = {"lock", "sem"})
  void anAcquireWhoseConnectionDropsBeforeItsReplyIsNeverSentTwice(String kind) throws Exception {
    String key = "dropped-reply:" + kind;
    try (Proxy proxy = new Proxy(server.port())) {
      RedisClient client = RedisClient.create("redis://127.0.0.1:" + proxy.port());
      try (Warden warden = Warden.create(LettuceTransport.create(client))) {
        // The waiter connections opened ahead are open: the next reply is the acquire's.
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
        while (((LettuceTransport) warden.transport()).waiterConnections() < 2
            && System.nanoTime() < end) {
          sleep(10);
        }
        sleep(200);
        proxy.dropNextReply.set(true);
        try {
          acquireOnce(warden, kind, key, Duration.ZERO);
        } catch (WardenException expected) {
          // the connection dropped: no reply, so no grant
        }
        assertTrue(!proxy.dropNextReply.get(), "the reply was dropped");
        awaitFree(key, info(kind));
      } finally {
        client.shutdown(0, 1, TimeUnit.SECONDS);
      }
    }
  }

  @ParameterizedTest
  @ValueSource(strings = {"lock", "sem"})
  void aWaiterKilledMidWaitIsNeverGranted(String kind) throws Exception {
    String key = "killed-waiter:" + kind;
    String other = "someone-else";
    if ("lock".equals(kind)) {
      server.call("LOCK.ACQUIRE", key, other, "30000");
    } else {
      server.call("SEM.ACQUIRE", key, other, "30000", "LIMIT", "2", "PERMITS", "2");
    }
    RedisClient client = RedisClient.create(server.uri());
    try (Warden warden = Warden.create(LettuceTransport.create(client))) {
      CompletableFuture<Void> call =
          CompletableFuture.runAsync(
              () -> {
                try {
                  acquireOnce(warden, kind, key, Duration.ofSeconds(10));
                } catch (Exception e) {
                  // the connection was killed
                }
              });
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      String id = null;
      while (id == null && System.nanoTime() < end) {
        Object list = server.call("CLIENT", "LIST");
        String text =
            list instanceof byte[]
                ? new String((byte[]) list, StandardCharsets.UTF_8)
                : String.valueOf(list);
        for (String line : text.split("\n")) {
          // The blocked one (flags b): the shared connection ran the same command's try.
          if (line.contains("cmd=" + ("lock".equals(kind) ? "lock.acquire" : "sem.acquire"))
              && line.matches(".* flags=[A-Za-z]*b.*")) {
            id = line.replaceAll("^id=(\\d+) .*$", "$1").trim();
          }
        }
        sleep(5);
      }
      assertTrue(id != null, "the waiter is listed");
      server.call("CLIENT", "KILL", "ID", id);
      try {
        call.get(10, TimeUnit.SECONDS);
      } catch (ExecutionException e) {
        // reported as an error
      }
      // Were the request sent again, it would queue anew and be granted at this release.
      server.call("lock".equals(kind) ? "LOCK.RELEASE" : "SEM.RELEASE", key, other);
      sleep(300);
      awaitFree(key, info(kind));
    } finally {
      client.shutdown(0, 1, TimeUnit.SECONDS);
    }
  }

  @org.junit.jupiter.api.Test
  void aCacheLeaseWonOnAWaiterConnectionLivesUntilItsFill() throws Exception {
    String key = "lease-on-waiter";
    RedisClient client = RedisClient.create(server.uri());
    // No idle waiter connection kept: a connection back in the pool is closed.
    try (Warden warden =
        Warden.builder(LettuceTransport.create(client, 8, 0))
            .cacheLease(Duration.ofSeconds(20))
            .build()) {
      AtomicInteger loads = new AtomicInteger();
      CompletableFuture<Void> firstGotTheLease = new CompletableFuture<>();
      CompletableFuture<Void> releaseFirst = new CompletableFuture<>();
      // The first caller takes the lease (fast path) and fails its load once the second waits:
      // the lease goes to the second, on its waiter connection.
      CompletableFuture<String> first =
          CompletableFuture.supplyAsync(
              () -> {
                try {
                  return warden
                      .cache()
                      .getOrLoadString(
                          key,
                          Duration.ofSeconds(60),
                          () -> {
                            firstGotTheLease.complete(null);
                            releaseFirst.get(10, TimeUnit.SECONDS);
                            throw new IllegalStateException("load failed");
                          });
                } catch (Exception e) {
                  return "failed";
                }
              });
      firstGotTheLease.get(10, TimeUnit.SECONDS);
      CompletableFuture<Void> secondLoading = new CompletableFuture<>();
      CompletableFuture<String> second =
          CompletableFuture.supplyAsync(
              () -> {
                try {
                  return warden
                      .cache()
                      .getOrLoadString(
                          key,
                          Duration.ofSeconds(60),
                          () -> {
                            loads.incrementAndGet();
                            secondLoading.complete(null);
                            // Longer than the pool keeps an unused connection open.
                            Thread.sleep(1500);
                            return "second";
                          });
                } catch (Exception e) {
                  return "error: " + e;
                }
              });
      long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
      while (server.wardenInfo("waiting_clients") == 0 && System.nanoTime() < end) {
        sleep(5);
      }
      releaseFirst.complete(null);
      assertEquals("failed", first.get(10, TimeUnit.SECONDS));
      secondLoading.get(10, TimeUnit.SECONDS);
      // While the second loads, a third caller waits for its fill instead of loading again.
      String third =
          warden
              .cache()
              .getOrLoadString(
                  key,
                  Duration.ofSeconds(60),
                  () -> {
                    loads.incrementAndGet();
                    return "third";
                  });
      assertEquals("second", second.get(10, TimeUnit.SECONDS));
      assertEquals("second", third);
      assertEquals(1, loads.get(), "one load after the failed one");
    } finally {
      client.shutdown(0, 1, TimeUnit.SECONDS);
    }
  }
}
