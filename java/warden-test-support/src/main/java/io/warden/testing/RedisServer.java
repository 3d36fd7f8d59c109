package io.warden.testing;

import java.io.File;
import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * A real server with the warden module, for tests: the binary from {@code WARDEN_SERVER} (default
 * {@code redis-server}), the module from {@code WARDEN_MODULE} (default the cargo build beside
 * {@code java/}), a free TCP port on 127.0.0.1, a temp dir, {@code --save ""}; killed on close.
 */
public final class RedisServer implements AutoCloseable {
  private final Path dir;
  private final int port;
  private final List<String> args;
  private Process process;
  private String version;

  private RedisServer(Path dir, int port, List<String> args) {
    this.dir = dir;
    this.port = port;
    this.args = args;
  }

  /**
   * Starts a server; {@code extraArgs} are added to its command line ({@code "--maxmemory", ...}).
   */
  public static RedisServer start(String... extraArgs) {
    return start(false, extraArgs);
  }

  /**
   * Starts a Sentinel (the same binary, {@code --sentinel}) monitoring {@code master} as {@code
   * name} with quorum 1.
   */
  public static RedisServer startSentinel(RedisServer master, String name) {
    try {
      Path dir = Files.createTempDirectory("warden-java-sentinel-");
      int port = freePort();
      Path conf = dir.resolve("sentinel.conf");
      Files.write(
          conf,
          ("sentinel monitor "
                  + name
                  + " "
                  + master.host()
                  + " "
                  + master.port()
                  + " 1\nsentinel down-after-milliseconds "
                  + name
                  + " 2000\nsentinel failover-timeout "
                  + name
                  + " 10000\n")
              .getBytes(StandardCharsets.UTF_8));
      List<String> args =
          new ArrayList<>(Arrays.asList(serverBinary(), conf.toString(), "--sentinel"));
      args.addAll(listening(port, dir));
      RedisServer sentinel = new RedisServer(dir, port, args);
      sentinel.spawn();
      return sentinel;
    } catch (IOException e) {
      throw new IllegalStateException("cannot start a sentinel", e);
    }
  }

  /** Starts a replica of this server (with the module) and waits until it has synced. */
  public RedisServer startReplica() {
    RedisServer r = start("--replicaof", host(), String.valueOf(port));
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(15);
    while (!r.info("replication").contains("master_link_status:up")) {
      if (System.nanoTime() > end) {
        r.close();
        throw new IllegalStateException("the replica never synced");
      }
      sleep(20);
    }
    return r;
  }

  /** Where a server (or Sentinel) listens and writes: its port on loopback, its dir and log. */
  private static List<String> listening(int port, Path dir) {
    return Arrays.asList(
        "--port",
        String.valueOf(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        dir.toString(),
        "--logfile",
        dir.resolve("redis.log").toString());
  }

  /** Starts a server without the warden module (for the "is warden loaded?" hint). */
  public static RedisServer startWithoutModule() {
    return start(true);
  }

  /**
   * Starts a server with another build of the module (the release before this one, for version
   * skew), or null when {@code WARDEN_PREV_MODULE} names none.
   */
  public static RedisServer startPreviousRelease() {
    String m = System.getenv("WARDEN_PREV_MODULE");
    return m == null || m.isEmpty() ? null : start(true, "--loadmodule", m);
  }

  private static RedisServer start(boolean noModule, String... extraArgs) {
    try {
      Path dir = Files.createTempDirectory("warden-java-");
      int port = freePort();
      List<String> args = new ArrayList<>();
      args.add(serverBinary());
      args.addAll(listening(port, dir));
      args.addAll(
          Arrays.asList(
              "--save",
              "",
              "--appendonly",
              "no",
              "--repl-diskless-sync-delay",
              "0",
              "--enable-debug-command",
              "yes"));
      if (!noModule) {
        args.add("--loadmodule");
        args.add(modulePath());
      }
      args.addAll(Arrays.asList(extraArgs));
      RedisServer server = new RedisServer(dir, port, args);
      server.spawn();
      return server;
    } catch (IOException e) {
      throw new IllegalStateException("cannot start a server", e);
    }
  }

  /** The server binary the tests start. */
  public static String serverBinary() {
    String s = System.getenv("WARDEN_SERVER");
    return s == null || s.isEmpty() ? "redis-server" : s;
  }

  /** The module the tests load. */
  public static String modulePath() {
    String m = System.getenv("WARDEN_MODULE");
    if (m != null && !m.isEmpty()) {
      return m;
    }
    String root = System.getenv("WARDEN_JAVA_ROOT");
    Path base = root == null || root.isEmpty() ? Paths.get("..") : Paths.get(root);
    return base.resolve("../target/release/libwarden.so").toAbsolutePath().normalize().toString();
  }

  private static int freePort() throws IOException {
    try (ServerSocket s = new ServerSocket()) {
      s.setReuseAddress(false);
      s.bind(new InetSocketAddress("127.0.0.1", 0));
      return s.getLocalPort();
    }
  }

  private void spawn() throws IOException {
    process =
        new ProcessBuilder(args)
            .directory(dir.toFile())
            .redirectOutput(new File(dir.toFile(), "stdout.log"))
            .redirectError(new File(dir.toFile(), "stderr.log"))
            .start();
    long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(20);
    while (true) {
      if (!process.isAlive()) {
        throw new IllegalStateException(
            "the server exited: " + String.join(" ", args) + "\n" + log());
      }
      try (RespClient c = client()) {
        c.call("PING");
        break;
      } catch (IOException | RuntimeException e) {
        if (System.nanoTime() > end) {
          throw new IllegalStateException("the server does not answer:\n" + log(), e);
        }
        sleep(10);
      }
    }
  }

  private String log() {
    StringBuilder sb = new StringBuilder();
    for (String f : new String[] {"redis.log", "stderr.log"}) {
      try {
        sb.append(new String(Files.readAllBytes(dir.resolve(f)), StandardCharsets.UTF_8));
      } catch (IOException e) {
        // not written
      }
    }
    return sb.toString();
  }

  private static void sleep(long ms) {
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException(e);
    }
  }

  public int port() {
    return port;
  }

  public String host() {
    return "127.0.0.1";
  }

  /** {@code redis://127.0.0.1:<port>}. */
  public String uri() {
    return "redis://127.0.0.1:" + port;
  }

  /**
   * The server's version as {@code name major.minor.patch} numbers: {@code redis 7.0.15}, {@code
   * valkey 9.1.2}.
   */
  public String version() {
    if (version == null) {
      String info = info("server");
      Matcher v = Pattern.compile("(?m)^valkey_version:([0-9.]+)").matcher(info);
      if (v.find()) {
        version = "valkey " + v.group(1);
      } else {
        Matcher r = Pattern.compile("(?m)^redis_version:([0-9.]+)").matcher(info);
        version = r.find() ? "redis " + r.group(1) : "unknown";
      }
    }
    return version;
  }

  /** Whether {@code CLIENT UNBLOCK} takes a warden waiter out (Redis >= 7.4, Valkey >= 8). */
  public boolean unblocksWaiters() {
    String[] parts = version().split(" ");
    String[] v = parts[1].split("\\.");
    int major = Integer.parseInt(v[0]);
    int minor = v.length > 1 ? Integer.parseInt(v[1]) : 0;
    return parts[0].equals("valkey") ? major >= 8 : major > 7 || (major == 7 && minor >= 4);
  }

  /** A new plain connection to this server (tests' own commands). */
  public RespClient client() throws IOException {
    return new RespClient(host(), port);
  }

  /** One command on a fresh connection. */
  public Object call(Object... args) {
    try (RespClient c = client()) {
      return c.call(args);
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /** {@code INFO section} as text. */
  public String info(String section) {
    Object r = call("INFO", section);
    return r instanceof byte[] ? new String((byte[]) r, StandardCharsets.UTF_8) : String.valueOf(r);
  }

  /** One integer field of {@code INFO warden} ({@code warden_<name>}), -1 when absent. */
  public long wardenInfo(String name) {
    Matcher m = Pattern.compile("(?m)^warden_" + name + ":(-?\\d+)").matcher(info("warden"));
    return m.find() ? Long.parseLong(m.group(1)) : -1;
  }

  /** Kills the server with SIGKILL (no shutdown, no save). */
  public void kill9() {
    if (process != null) {
      process.destroyForcibly();
      try {
        process.waitFor(10, TimeUnit.SECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** Kills the server (SIGKILL) and starts it again on the same port and directory. */
  public void restart() {
    kill9();
    try {
      spawn();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  @Override
  public void close() {
    kill9();
    try (Stream<Path> files = Files.walk(dir)) {
      files.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
    } catch (IOException e) {
      // a temp dir left behind is harmless
    }
  }
}
