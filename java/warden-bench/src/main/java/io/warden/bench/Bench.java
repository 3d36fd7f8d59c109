package io.warden.bench;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.stream.Collectors;
import jdk.jfr.consumer.RecordedEvent;
import jdk.jfr.consumer.RecordedFrame;
import jdk.jfr.consumer.RecordingFile;
import org.HdrHistogram.Histogram;

/**
 * make bench SECTION=java: warden's Java client (Lettuce and Jedis transports) against Redisson
 * 4.7.0, Spring Integration's RedisLockRegistry 7.1.2 (spin and pub/sub) and the Jedis SET NX PX
 * lock, side by side on one redis-server. Prints markdown and writes OUT.md and OUT.json.
 *
 * <pre>
 * java -cp ... io.warden.bench.Bench [--quick] [--rounds N] [--out PREFIX] [--only name,name]
 * </pre>
 *
 * WARDEN_MODULE: the module (required); WARDEN_SERVER: the server (default redis-server). Workers
 * are child JVMs of this one (the same java), started with "worker", "uncontended" or "vt" as the
 * first argument.
 */
public final class Bench {
  static final int THREADS = 16;
  static final long LEASE_MS = 10_000;
  static final int HOLD_MS = 1;
  static final int SEM_LIMIT = 4;
  static final int RW_WRITE_EVERY = 4;
  static final int WARMUP_ITERATIONS = 20;

  /** Contended warm-up: until the JIT compiles for less than this share of a second... */
  static final double WARMUP_COMPILE_SHARE = 0.02;

  /** ...or for this long at most. */
  static final double WARMUP_MAX_S = 30;

  static final int UNCONTENDED_ITERATIONS = 200;
  static final int VIRTUAL_THREADS = 10_000;

  /** A worker's start and warm-up, or its last waiters after the window, on a busy box. */
  static final double STARTUP_S = 60 + WARMUP_MAX_S;

  static final List<String> LOCKS =
      List.of(
          "warden-lettuce-lock",
          "warden-jedis-lock",
          "redisson-lock",
          "registry-spin-lock",
          "registry-pubsub-lock",
          "jedis-setnx-lock");
  static final List<String> SEMAPHORES = List.of("warden-lettuce-sem", "redisson-sem");
  static final List<String> READ_WRITE = List.of("warden-lettuce-rw", "redisson-rw");
  static final List<String> VIRTUAL = List.of("warden-lettuce-lock", "redisson-lock");

  static final Map<String, String> LABELS =
      Map.of(
          "warden-lettuce", "warden (Lettuce)",
          "warden-jedis", "warden (Jedis)",
          "redisson", "Redisson",
          "registry-spin", "RedisLockRegistry SPIN_LOCK",
          "registry-pubsub", "RedisLockRegistry PUB_SUB_LOCK",
          "jedis-setnx", "Jedis SET NX PX + sleep 1-5 ms");

  public static void main(String[] args) throws Exception {
    if (args.length > 0) {
      String[] rest = Arrays.copyOfRange(args, 1, args.length);
      switch (args[0]) {
        case "worker" -> {
          Worker.run(rest);
          System.exit(0);
        }
        case "uncontended" -> {
          Worker.uncontended(rest);
          System.exit(0);
        }
        case "vt" -> {
          Worker.virtualThreads(rest);
          System.exit(0);
        }
        default -> {}
      }
    }
    List<String> argv = Arrays.asList(args);
    boolean quick = argv.contains("--quick");
    Path out =
        Path.of(
            argv.contains("--out") ? argv.get(argv.indexOf("--out") + 1) : "bench/results/java");
    List<String> only =
        argv.contains("--only")
            ? Arrays.asList(argv.get(argv.indexOf("--only") + 1).split(","))
            : null;
    String module = System.getenv("WARDEN_MODULE");
    if (module == null) {
      System.err.println("WARDEN_MODULE: the module to load");
      System.exit(2);
    }
    String serverBin = System.getenv().getOrDefault("WARDEN_SERVER", "redis-server");
    int rounds =
        argv.contains("--rounds")
            ? Integer.parseInt(argv.get(argv.indexOf("--rounds") + 1))
            : quick ? 1 : 5;
    new Bench(quick, rounds, only).runAll(serverBin, module, out);
  }

  private final boolean quick;
  private final List<String> only;
  private final double seconds;
  private final int rounds;
  private final double slice;
  private final long started = System.nanoTime();

  private Bench(boolean quick, int rounds, List<String> only) {
    this.quick = quick;
    this.only = only;
    this.seconds = quick ? 3 : 10;
    this.rounds = rounds;
    this.slice = seconds / rounds;
  }

  private boolean selected(String name) {
    return only == null || only.contains(name);
  }

  static String label(String contender) {
    String base = contender.replaceFirst("-(lock|sem|rw)$", "");
    return LABELS.getOrDefault(base, base);
  }

  private void runAll(String serverBin, String module, Path out) throws Exception {
    Map<String, Object> json = new LinkedHashMap<>();
    StringBuilder md = new StringBuilder();
    String before = machine();
    try (Server server = new Server(serverBin, module)) {
      Map<String, Object> versions = new LinkedHashMap<>();
      versions.put("server", "Redis " + server.version() + " (" + serverBin + ")");
      versions.put("module", server.moduleVersion() + " (" + module + ")");
      versions.put(
          "java", System.getProperty("java.vm.vendor") + " " + System.getProperty("java.version"));
      versions.put("lettuce", "7.7.0.RELEASE");
      versions.put("jedis", "8.0.2");
      versions.put("redisson", "4.7.0");
      versions.put("spring-integration-redis", "7.1.2");
      versions.put("HdrHistogram", "2.2.2");
      json.put("versions", versions);
      json.put("quick", quick);
      json.put(
          "params",
          Map.of(
              "threads", THREADS,
              "hold-ms", HOLD_MS,
              "lease-ms", LEASE_MS,
              "seconds", seconds,
              "semaphore-limit", SEM_LIMIT,
              "rw-write-every", RW_WRITE_EVERY,
              "uncontended-iterations", UNCONTENDED_ITERATIONS,
              "virtual-threads", VIRTUAL_THREADS));

      md.append(
          "## Java: warden's client against Redisson, RedisLockRegistry and Jedis SET NX\n\n");
      md.append("Server: ").append(versions.get("server")).append("; module: ");
      md.append(versions.get("module")).append(".  \n");
      md.append("Every client on ").append(versions.get("java"));
      md.append(
          "; lettuce 7.7.0.RELEASE, jedis 8.0.2, redisson 4.7.0, spring-integration-redis 7.1.2");
      md.append(" (spring-data-redis 4.1.2, Lettuce), HdrHistogram 2.2.2.  \n");
      md.append("Machine at the start: ").append(before).append("  \n\n");

      double rttMs = roundTripMs(server);
      json.put("round_trip_ms", rttMs);
      List<Map<String, Object>> lockRows = contended(server, LOCKS);
      List<Map<String, Object>> semRows = contended(server, SEMAPHORES);
      List<Map<String, Object>> rwRows = contended(server, READ_WRITE);
      List<Map<String, Object>> uncontended = new ArrayList<>();
      for (String c : concat(LOCKS, SEMAPHORES, READ_WRITE)) {
        if (selected(c)) {
          uncontended.add(uncontended(server, c));
        }
      }
      List<Map<String, Object>> virtual = new ArrayList<>();
      for (String c : VIRTUAL) {
        if (selected(c)) {
          virtual.add(virtualThreads(server, c));
        }
      }
      json.put("lock", lockRows);
      json.put("semaphore", semRows);
      json.put("read-write", rwRows);
      json.put("uncontended", uncontended);
      json.put("virtual-threads", virtual);

      String hold = "Thread.sleep(" + HOLD_MS + ") inside, measured " + heldMs(lockRows) + " ms";
      md.append("**Lock, ")
          .append(THREADS)
          .append(" threads on one key**: each thread loops acquire, ");
      md.append(hold).append(", release, for ").append(fmt(seconds)).append(" s");
      if (rounds > 1) {
        md.append(": ").append(rounds).append(" slices of ").append(fmt(slice));
        md.append(
            " s per client, the clients taking turns (every JVM started first), so that other");
        md.append(" work on the machine falls on all alike; in brackets the slowest and fastest");
        md.append(" slice's hand-offs/s");
      }
      md.append(
          " (held %: hand-offs/s × the hold, the share of the run the lock was held; 100 % is the");
      md.append(" ceiling). One JVM × 16 threads, and 4 JVMs");
      md.append(" × 4 threads (child processes of the harness, results summed). Lease ")
          .append(LEASE_MS);
      md.append(
          " ms for every client (Redisson `lock(lease)`, RedisLockRegistry `expireAfter`, `PX`).");
      md.append(" Wait: from the call to the grant (HdrHistogram, µs). Server CPU: `INFO cpu`");
      md.append(
          " used_cpu_sys + used_cpu_user over the run; commands: `INFO commandstats` over the run,");
      md.append(" those run inside scripts included.\n\n");
      table(md, lockRows);
      others(md, lockRows);
      ratios(md, lockRows, "redisson-lock", true);
      transports(md, lockRows, rttMs);
      md.append(
          """

          How the incumbents wait: Redisson retries its Lua script when its pub/sub channel says \
          the lock was released (a thread that releases may take the lock again before a woken \
          waiter: it is not FIFO). RedisLockRegistry takes a per-JVM `ReentrantLock` before Redis, \
          so in one JVM only one thread at a time talks to Redis; across JVMs SPIN_LOCK retries \
          every 100 ms (`idleBetweenTries`' default) and PUB_SUB_LOCK waits for an unlock message. \
          The SET NX lock polls with `Thread.sleep` of a random 1-5 ms; the thread that releases \
          does not sleep, so it often takes the lock again at once. warden queues each waiter on \
          the server (`LOCK.ACQUIRE ... WAIT`) and grants in FIFO order in the release's \
          event-loop turn.
          """);

      md.append("\n**Semaphore, limit ").append(SEM_LIMIT).append(", ").append(THREADS);
      md.append(" threads**: warden `getSemaphore(key, ").append(SEM_LIMIT);
      md.append(
          ").acquire(1, lease)` against Redisson's `RPermitExpirableSemaphore.acquire(lease)`");
      md.append(" (permits with an id and a lease, as warden's); same loop, acquisitions/s.\n\n");
      table(md, semRows);
      others(md, semRows);
      ratios(md, semRows, "redisson-sem", false);

      md.append("\n**Read-write lock, ").append(THREADS).append(" threads**: every ");
      md.append(RW_WRITE_EVERY).append("th hold of a thread a write, the others reads;");
      md.append(" `getReadWriteLock` against `RReadWriteLock`, same loop, acquisitions/s.\n\n");
      table(md, rwRows);
      others(md, rwRows);
      ratios(md, rwRows, "redisson-rw", false);

      md.append("\n**Uncontended acquire + release**: one thread, ").append(UNCONTENDED_ITERATIONS);
      md.append(
          " times on a free key, counted with `MONITOR` (sent: the client's commands; run: with");
      md.append(" those inside Lua scripts). Target for warden: 2 sent.\n\n");
      md.append(
          "| client | workload | commands sent | commands run | which (per acquire + release) |");
      md.append(" target |\n");
      md.append("|---|---|---|---|---|---|\n");
      for (Map<String, Object> u : uncontended) {
        md.append("| ").append(label((String) u.get("contender"))).append(" | ");
        md.append(workload((String) u.get("contender"))).append(" | ");
        if (u.containsKey("failed")) {
          md.append("failed: ").append(u.get("failed")).append(" | | | |\n");
          continue;
        }
        md.append(fmt((Double) u.get("sent"))).append(" | ").append(fmt((Double) u.get("run")));
        md.append(" | ").append(u.get("which")).append(" | ");
        md.append(
            ((String) u.get("contender")).startsWith("warden")
                ? mark((Double) u.get("sent") == 2.0)
                : "anchor");
        md.append(" |\n");
      }

      md.append("\n**Virtual threads**: ").append(VIRTUAL_THREADS);
      md.append(
          " virtual threads, each taking and releasing the same lock once (lease 10 s), under JFR");
      md.append(
          " with `jdk.VirtualThreadPinned` at threshold 0. Library frames: events whose stack has");
      md.append(
          " a frame of the library (`io.warden` outside the harness; `org.redisson`). Target for");
      md.append(" warden: 0.\n\n");
      md.append("| client | completed | errors | seconds | pinned events | with a library frame |");
      md.append(" target |\n");
      md.append("|---|---|---|---|---|---|---|\n");
      for (Map<String, Object> v : virtual) {
        String c = (String) v.get("contender");
        md.append("| ").append(label(c)).append(" | ");
        if (v.containsKey("failed")) {
          md.append("failed: ").append(v.get("failed")).append(" | | | | | |\n");
          continue;
        }
        md.append(v.get("completed")).append(" | ").append(v.get("errors"));
        String sample = (String) v.get("error_sample");
        if (!sample.isEmpty()) {
          md.append(" (").append(sample.replace('|', '/')).append(")");
        }
        md.append(" | ").append(fmt((Double) v.get("seconds")));
        md.append(" | ").append(v.get("pinned")).append(" | ").append(v.get("pinned_in_library"));
        md.append(" | ")
            .append(
                c.startsWith("warden") ? mark((Long) v.get("pinned_in_library") == 0) : "anchor");
        md.append(" |\n");
      }
    }
    String after = machine();
    json.put("machine", Map.of("start", before, "end", after));
    md.append("\nMachine at the end: ").append(after).append("  \n");
    md.append("(").append(fmt((System.nanoTime() - started) / 1e9)).append(" s on 2 cores.)\n");
    System.out.print(md);
    Files.writeString(Path.of(out + ".md"), md.toString());
    Files.writeString(Path.of(out + ".json"), Json.write(json));
  }

  @SafeVarargs
  private static List<String> concat(List<String>... lists) {
    List<String> out = new ArrayList<>();
    for (List<String> l : lists) {
      out.addAll(l);
    }
    return out;
  }

  private static String workload(String contender) {
    return switch (Worker.Workload.of(contender)) {
      case LOCK -> "lock";
      case SEM -> "semaphore";
      case RW -> "read-write";
    };
  }

  /** Load averages and what else used the 2 cores over one second (top), this JVM left out. */
  private static String machine() {
    try {
      String[] load = Files.readString(Path.of("/proc/loadavg")).trim().split(" ");
      Process top =
          new ProcessBuilder("top", "-b", "-n", "2", "-d", "1", "-w", "200")
              .redirectErrorStream(true)
              .start();
      List<String> lines;
      try (BufferedReader r =
          new BufferedReader(new InputStreamReader(top.getInputStream(), StandardCharsets.UTF_8))) {
        lines = r.lines().collect(Collectors.toList());
      }
      top.waitFor();
      // the second frame: CPU over the second between the two
      int frame = 0;
      List<String> busy = new ArrayList<>();
      String me = String.valueOf(ProcessHandle.current().pid());
      for (String line : lines) {
        if (line.startsWith("top -")) {
          frame++;
          continue;
        }
        String[] f = line.trim().split("\\s+");
        if (frame < 2 || f.length < 12 || !f[0].matches("\\d+") || f[0].equals(me)) {
          continue;
        }
        double cpu = Double.parseDouble(f[8]);
        if (cpu >= 1.0) {
          busy.add(f[11] + " " + fmt(cpu) + " %");
        }
      }
      return "load average "
          + load[0]
          + " "
          + load[1]
          + " "
          + load[2]
          + "; other processes using ≥ 1 % of a core over one second (top): "
          + (busy.isEmpty() ? "none" : String.join(", ", busy))
          + ".";
    } catch (IOException | InterruptedException | RuntimeException e) {
      return "unknown (" + e + ")";
    }
  }

  // ---------------------------------------------------------------- contended runs

  /**
   * Every contender's JVMs are started first; then ROUNDS rounds, each giving every contender one
   * slice in turn (the order rotating), so a burst of other work on the machine falls on all of
   * them alike. A row sums its slices.
   */
  private List<Map<String, Object>> contended(Server server, List<String> contenders)
      throws Exception {
    List<Map<String, Object>> rows = new ArrayList<>();
    List<String> names = contenders.stream().filter(this::selected).toList();
    if (names.isEmpty()) {
      return rows;
    }
    for (int jvms : new int[] {1, 4}) {
      List<Group> groups = new ArrayList<>();
      try {
        for (String c : names) {
          System.err.printf("java bench: %s, %d JVM(s): starting%n", c, jvms);
          groups.add(new Group(server, c, jvms));
        }
        for (int round = 0; round < rounds; round++) {
          System.err.printf("java bench: %d JVM(s), round %d of %d%n", jvms, round + 1, rounds);
          for (int i = 0; i < groups.size(); i++) {
            groups.get((i + round) % groups.size()).slice(server, slice);
          }
        }
      } finally {
        for (Group g : groups) {
          g.close();
          rows.add(g.row());
        }
      }
    }
    return rows;
  }

  private static List<String> javaCommand(String... args) {
    List<String> cmd = new ArrayList<>();
    cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
    cmd.add("-Xmx256m");
    cmd.add("-cp");
    cmd.add(System.getProperty("java.class.path"));
    cmd.add(Bench.class.getName());
    cmd.addAll(Arrays.asList(args));
    return cmd;
  }

  /** A child JVM, its stdout read line by line, stderr kept in a file for failures. */
  private static final class Child implements AutoCloseable {
    private static final String EOF = "\u0000eof";
    final Process process;
    final PrintStream in;
    final Path err;
    private final BlockingQueue<String> lines = new LinkedBlockingQueue<>();

    Child(List<String> cmd) throws IOException {
      err = Files.createTempFile("warden-bench-", ".err");
      process = new ProcessBuilder(cmd).redirectError(err.toFile()).start();
      BufferedReader out =
          new BufferedReader(
              new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8));
      Thread reader =
          new Thread(
              () -> {
                try {
                  for (String line; (line = out.readLine()) != null; ) {
                    lines.add(line);
                  }
                } catch (IOException e) {
                  // the child is gone: EOF below
                }
                lines.add(EOF);
              });
      reader.setDaemon(true);
      reader.start();
      in = new PrintStream(process.getOutputStream(), true, StandardCharsets.UTF_8);
    }

    /**
     * The next line starting with prefix within timeoutSeconds; other lines (a library's logging)
     * skipped. A worker that hangs or dies fails its row, not the bench.
     */
    String await(String prefix, double timeoutSeconds) throws IOException, InterruptedException {
      long deadline = System.nanoTime() + (long) (timeoutSeconds * 1e9);
      for (; ; ) {
        String line = lines.poll(deadline - System.nanoTime(), TimeUnit.NANOSECONDS);
        if (line == null) {
          process.destroyForcibly();
          throw new IOException(
              "no " + prefix + " within " + fmt(timeoutSeconds) + " s" + stderr());
        }
        if (line == EOF) {
          throw new IOException("worker exited" + stderr());
        }
        if (line.startsWith(prefix)) {
          return line;
        }
      }
    }

    private String stderr() throws IOException {
      String tail =
          Files.readString(err)
              .lines()
              .filter(l -> !l.isBlank() && !l.startsWith("WARNING"))
              .limit(3)
              .collect(Collectors.joining(" / "));
      // one table cell: no pipes, no tabs, no newlines
      tail = tail.replaceAll("\\s+", " ").replace('|', '/');
      return tail.isEmpty() ? "" : " (" + tail + ")";
    }

    @Override
    public void close() throws IOException {
      in.close();
      try {
        if (!process.waitFor(30, TimeUnit.SECONDS)) {
          process.destroyForcibly();
        }
      } catch (InterruptedException e) {
        process.destroyForcibly();
        Thread.currentThread().interrupt();
      }
      Files.deleteIfExists(err);
    }
  }

  /** One contender's JVMs across the rounds, and what its slices add up to. */
  private static final class Group implements AutoCloseable {
    final String contender;
    final int jvms;
    final List<Child> children = new ArrayList<>();
    final long[] counts = new long[THREADS];
    final Histogram waits = new Histogram(3_600_000_000L, 3);
    final Map<String, Long> calls = new HashMap<>();
    final List<Double> perSlice = new ArrayList<>();
    final List<Double> others = new ArrayList<>();
    double seconds;
    double cpu;
    long overlaps;
    long errors;
    double heldNs;
    long heldSlices;
    String error = "";
    String failed;

    Group(Server server, String contender, int jvms) {
      this.contender = contender;
      this.jvms = jvms;
      String key = contender + "-" + jvms + "-" + System.nanoTime();
      try {
        for (int i = 0; i < jvms; i++) {
          children.add(
              new Child(
                  javaCommand(
                      "worker",
                      contender,
                      String.valueOf(THREADS / jvms),
                      String.valueOf(server.port),
                      key)));
        }
        for (Child c : children) {
          c.await("READY", STARTUP_S);
        }
      } catch (IOException | InterruptedException e) {
        fail(e);
      }
    }

    private void fail(Exception e) {
      failed = e.getMessage();
      System.err.println("java bench: " + contender + " failed: " + failed);
      children.forEach(c -> c.process.destroyForcibly());
    }

    void slice(Server server, double secs) {
      if (failed != null) {
        return;
      }
      try {
        List<Long> pids = new ArrayList<>(List.of(ProcessHandle.current().pid(), server.pid()));
        children.forEach(c -> pids.add(c.process.pid()));
        long[] machine0 = Cpu.sample(pids);
        double cpu0 = server.cpuSeconds();
        Map<String, Long> calls0 = server.commandCalls();
        for (Child c : children) {
          c.in.println("GO " + secs);
        }
        List<String> results = new ArrayList<>();
        for (Child c : children) {
          results.add(c.await("RESULT", secs + STARTUP_S));
        }
        cpu += server.cpuSeconds() - cpu0;
        Server.delta(calls0, server.commandCalls()).forEach((k, v) -> calls.merge(k, v, Long::sum));
        others.add(Cpu.othersCores(machine0, Cpu.sample(pids)));
        seconds += secs;
        long total = 0;
        int t = 0;
        for (String r : results) {
          Map<String, String> f = fields(r);
          for (String n : f.get("counts").split(",")) {
            counts[t++] += Long.parseLong(n);
            total += Long.parseLong(n);
          }
          waits.add(Worker.decode(f.get("hist")));
          overlaps += Long.parseLong(f.get("overlaps"));
          errors += Long.parseLong(f.get("errors"));
          heldNs += Double.parseDouble(f.get("held_ns"));
          heldSlices++;
          if (error.isEmpty()) {
            error = f.getOrDefault("error", "").replace('_', ' ');
          }
        }
        perSlice.add(total / secs);
      } catch (Exception e) {
        fail(e);
      }
    }

    Map<String, Object> row() {
      Map<String, Object> row = new LinkedHashMap<>();
      row.put("contender", contender);
      row.put("jvms", jvms);
      row.put("threads", THREADS);
      if (failed != null) {
        row.put("failed", failed);
        return row;
      }
      long total = Arrays.stream(counts).sum();
      long max = Arrays.stream(counts).max().orElse(0);
      long min = Arrays.stream(counts).min().orElse(0);
      long commands = calls.values().stream().mapToLong(Long::longValue).sum();
      row.put("seconds", seconds);
      row.put("handoffs", total);
      row.put("handoffs_per_s", total / seconds);
      row.put("handoffs_per_s_slices", perSlice);
      row.put("p50_ms", waits.getValueAtPercentile(50) / 1000.0);
      row.put("p99_ms", waits.getValueAtPercentile(99) / 1000.0);
      row.put("max_ms", waits.getMaxValue() / 1000.0);
      row.put("per_thread", Arrays.stream(counts).boxed().toList());
      row.put("fairness", min == 0 ? Double.POSITIVE_INFINITY : (double) max / min);
      row.put("server_cpu_s", cpu);
      row.put("cpu_ms_per_1000", total == 0 ? Double.NaN : cpu * 1000 / (total / 1000.0));
      row.put("commands", commands);
      row.put("commands_per_handoff", total == 0 ? Double.NaN : (double) commands / total);
      row.put("commands_by_name", top(calls, 6));
      row.put("held_ms", heldNs / Math.max(1, heldSlices) / 1e6);
      row.put("overlaps", overlaps);
      row.put("errors", errors);
      row.put("error_sample", error);
      row.put("others_cores", others.stream().mapToDouble(Double::doubleValue).average().orElse(0));
      return row;
    }

    @Override
    public void close() {
      for (Child c : children) {
        try {
          c.close();
        } catch (IOException e) {
          c.process.destroyForcibly();
        }
      }
    }
  }

  private static Map<String, Long> top(Map<String, Long> calls, int n) {
    Map<String, Long> out = new LinkedHashMap<>();
    calls.entrySet().stream()
        .sorted((a, b) -> Long.compare(b.getValue(), a.getValue()))
        .limit(n)
        .forEach(e -> out.put(e.getKey(), e.getValue()));
    return out;
  }

  static Map<String, String> fields(String line) {
    Map<String, String> out = new LinkedHashMap<>();
    for (String part : line.split(" ")) {
      int i = part.indexOf('=');
      if (i > 0) {
        out.put(part.substring(0, i), part.substring(i + 1));
      }
    }
    return out;
  }

  // ---------------------------------------------------------------- uncontended

  private Map<String, Object> uncontended(Server server, String contender) throws Exception {
    Map<String, Object> row = new LinkedHashMap<>();
    row.put("contender", contender);
    System.err.printf("java bench: %s, uncontended%n", contender);
    String key = contender + "-free-" + System.nanoTime();
    try (Child child =
            new Child(
                javaCommand(
                    "uncontended",
                    contender,
                    String.valueOf(UNCONTENDED_ITERATIONS),
                    String.valueOf(server.port),
                    key));
        Socket monitor = new Socket("127.0.0.1", server.port)) {
      child.await("READY", STARTUP_S);
      OutputStream mo = monitor.getOutputStream();
      BufferedReader mi =
          new BufferedReader(
              new InputStreamReader(monitor.getInputStream(), StandardCharsets.UTF_8));
      mo.write("MONITOR\r\n".getBytes(StandardCharsets.UTF_8));
      mo.flush();
      mi.readLine(); // +OK
      String start = "warden-bench-start-" + System.nanoTime();
      String end = "warden-bench-end-" + System.nanoTime();
      server.admin.echo(start);
      child.in.println("GO");
      child.await("DONE", STARTUP_S);
      server.admin.echo(end);
      boolean in = false;
      long sent = 0;
      long run = 0;
      Map<String, Long> names = new LinkedHashMap<>();
      for (String line; (line = mi.readLine()) != null; ) {
        if (line.contains(start)) {
          in = true;
          continue;
        }
        if (line.contains(end)) {
          break;
        }
        int b = line.indexOf(" [");
        int e = line.indexOf("] ", b);
        if (!in || b < 0 || e < 0) {
          continue;
        }
        String cmd = line.substring(e + 2).split(" ", 2)[0].replace("\"", "").toLowerCase();
        boolean lua = line.substring(b, e).endsWith(" lua");
        run++;
        if (!lua) {
          sent++;
          names.merge(cmd, 1L, Long::sum);
        }
      }
      row.put("sent", (double) sent / UNCONTENDED_ITERATIONS);
      row.put("run", (double) run / UNCONTENDED_ITERATIONS);
      row.put(
          "which",
          names.entrySet().stream()
              .map(
                  x ->
                      x.getKey()
                          + (x.getValue() == UNCONTENDED_ITERATIONS
                              ? ""
                              : " ×" + fmtCount((double) x.getValue() / UNCONTENDED_ITERATIONS)))
              .collect(Collectors.joining(", ")));
    } catch (IOException e) {
      row.put("failed", e.getMessage());
    }
    return row;
  }

  // ---------------------------------------------------------------- virtual threads

  private Map<String, Object> virtualThreads(Server server, String contender) throws Exception {
    Map<String, Object> row = new LinkedHashMap<>();
    row.put("contender", contender);
    row.put("virtual_threads", VIRTUAL_THREADS);
    System.err.printf("java bench: %s, %d virtual threads%n", contender, VIRTUAL_THREADS);
    Path jfr = Files.createTempFile("warden-bench-", ".jfr");
    List<String> cmd =
        javaCommand(
            "vt",
            contender,
            String.valueOf(VIRTUAL_THREADS),
            String.valueOf(server.port),
            contender + "-vt-" + System.nanoTime());
    cmd.add(
        1,
        "-XX:StartFlightRecording=filename="
            + jfr
            + ",jdk.VirtualThreadPinned#enabled=true,jdk.VirtualThreadPinned#threshold=0ms");
    try (Child child = new Child(cmd)) {
      Map<String, String> f = fields(child.await("RESULT", 5 * STARTUP_S));
      child.in.close();
      child.process.waitFor(60, TimeUnit.SECONDS);
      row.put("completed", Long.parseLong(f.get("completed")));
      row.put("seconds", Double.parseDouble(f.get("seconds")));
      row.put("errors", Long.parseLong(f.get("errors")));
      row.put("error_sample", f.getOrDefault("error", "").replace('_', ' '));
      String prefix = contender.startsWith("warden") ? "io.warden." : "org.redisson.";
      long pinned = 0;
      long inLibrary = 0;
      String sample = "";
      for (RecordedEvent e : RecordingFile.readAllEvents(jfr)) {
        if (!e.getEventType().getName().equals("jdk.VirtualThreadPinned")) {
          continue;
        }
        pinned++;
        if (e.getStackTrace() == null) {
          continue;
        }
        for (RecordedFrame fr : e.getStackTrace().getFrames()) {
          String type = fr.getMethod().getType().getName();
          if (type.startsWith(prefix) && !type.startsWith("io.warden.bench.")) {
            inLibrary++;
            if (sample.isEmpty()) {
              sample = type + "." + fr.getMethod().getName();
            }
            break;
          }
        }
      }
      row.put("pinned", pinned);
      row.put("pinned_in_library", inLibrary);
      row.put("sample_frame", sample);
    } catch (IOException e) {
      row.put("failed", e.getMessage());
    } finally {
      Files.deleteIfExists(jfr);
    }
    return row;
  }

  // ---------------------------------------------------------------- markdown

  private static String heldMs(List<Map<String, Object>> rows) {
    return fmt(
        rows.stream()
            .filter(r -> r.containsKey("held_ms"))
            .mapToDouble(r -> (Double) r.get("held_ms"))
            .average()
            .orElse(Double.NaN));
  }

  private static void table(StringBuilder md, List<Map<String, Object>> rows) {
    md.append(
        "| client | JVMs × threads | hand-offs/s | held % | p50 wait ms | p99 wait ms | max wait ms |");
    md.append(
        " per-thread max/min | server CPU ms / 1,000 hand-offs | server commands / hand-off |");
    md.append(" errors | overlaps | other processes, cores |\n");
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (Map<String, Object> r : rows) {
      int jvms = (Integer) r.get("jvms");
      md.append("| ").append(label((String) r.get("contender"))).append(" | ");
      md.append(jvms).append(" × ").append(THREADS / jvms).append(" | ");
      if (r.containsKey("failed")) {
        md.append("failed: ").append(r.get("failed")).append(" | | | | | | | | | | |\n");
        continue;
      }
      md.append(String.format("%,.0f", (Double) r.get("handoffs_per_s")));
      @SuppressWarnings("unchecked")
      List<Double> slices = (List<Double>) r.get("handoffs_per_s_slices");
      if (slices.size() > 1) {
        md.append(
            String.format(
                " (%,.0f–%,.0f)",
                slices.stream().mapToDouble(Double::doubleValue).min().getAsDouble(),
                slices.stream().mapToDouble(Double::doubleValue).max().getAsDouble()));
      }
      md.append(" | ");
      // the share of the run a permit was held: hand-offs/s × hold ÷ the permits there are
      Worker.Workload w = Worker.Workload.of((String) r.get("contender"));
      md.append(
              w == Worker.Workload.RW
                  ? "–"
                  : String.format(
                      "%.0f",
                      (Double) r.get("handoffs_per_s") * (Double) r.get("held_ms") / 10 / w.limit))
          .append(" | ");
      md.append(fmt((Double) r.get("p50_ms"))).append(" | ");
      md.append(fmt((Double) r.get("p99_ms"))).append(" | ");
      md.append(fmt((Double) r.get("max_ms"))).append(" | ");
      double fair = (Double) r.get("fairness");
      md.append(Double.isInfinite(fair) ? "∞ (a thread got none)" : fmt(fair)).append(" | ");
      md.append(fmt((Double) r.get("cpu_ms_per_1000"))).append(" | ");
      md.append(fmt((Double) r.get("commands_per_handoff"))).append(" | ");
      md.append(r.get("errors")).append(" | ").append(r.get("overlaps")).append(" | ");
      md.append(fmt((Double) r.get("others_cores"))).append(" |\n");
    }
  }

  /** What the rest of the machine used while these rows ran. */
  private static void others(StringBuilder md, List<Map<String, Object>> rows) {
    double[] cores =
        rows.stream()
            .filter(r -> r.containsKey("others_cores"))
            .mapToDouble(r -> (Double) r.get("others_cores"))
            .toArray();
    if (cores.length > 0) {
      md.append("\nOther processes (not this server or these JVMs) used ");
      md.append(fmt(Arrays.stream(cores).min().getAsDouble())).append("–");
      md.append(fmt(Arrays.stream(cores).max().getAsDouble()));
      md.append(" of the 2 cores during these runs (/proc/stat less the bench's processes).\n");
    }
  }

  private static Map<String, Object> find(List<Map<String, Object>> rows, String c, int jvms) {
    for (Map<String, Object> r : rows) {
      if (r.get("contender").equals(c)
          && (Integer) r.get("jvms") == jvms
          && !r.containsKey("failed")) {
        return r;
      }
    }
    return null;
  }

  /** warden's rows against the anchor (Redisson) and, for locks, RedisLockRegistry's. */
  private static void ratios(
      StringBuilder md, List<Map<String, Object>> rows, String anchor, boolean registry) {
    String suffix = anchor.substring(anchor.lastIndexOf('-'));
    md.append('\n');
    for (String w : List.of("warden-lettuce" + suffix, "warden-jedis" + suffix)) {
      for (int jvms : new int[] {1, 4}) {
        Map<String, Object> me = find(rows, w, jvms);
        Map<String, Object> r = find(rows, anchor, jvms);
        if (me == null || r == null) {
          continue;
        }
        double rate = (Double) me.get("handoffs_per_s") / (Double) r.get("handoffs_per_s");
        double p99 = (Double) r.get("p99_ms") / (Double) me.get("p99_ms");
        double fair = (Double) me.get("fairness");
        double cpu = (Double) me.get("cpu_ms_per_1000") / (Double) r.get("cpu_ms_per_1000");
        md.append("- ").append(label(w)).append(", ").append(jvms).append(" JVM");
        md.append(jvms > 1 ? "s" : "").append(", ÷ ").append(label(anchor)).append(": **");
        md.append(fmt(rate)).append("×** hand-offs/s (≥ 1.5 ").append(mark(rate >= 1.5));
        // A lock cannot hand off faster than 1 / hold: say when the target lies above that.
        double ceiling = 1000 / (Double) me.get("held_ms") * Worker.Workload.of(w).limit;
        double wanted = 1.5 * (Double) r.get("handoffs_per_s");
        if (Worker.Workload.of(w) != Worker.Workload.RW && wanted > ceiling) {
          md.append(
              String.format(
                  "; 1.5× would be %,.0f/s, above the ceiling of %,.0f/s that the %s ms hold allows",
                  wanted, ceiling, fmt((Double) me.get("held_ms"))));
        }
        md.append("), p99 **1/").append(fmt(p99)).append("** (≤ 1/5 ").append(mark(p99 >= 5));
        md.append("), per-thread max/min ").append(fmt(fair)).append(" (≤ 1.1 ");
        md.append(mark(fair <= 1.1))
            .append("), server CPU per hand-off ")
            .append(fmt(cpu))
            .append("×");
        if (registry) {
          for (String reg : List.of("registry-spin-lock", "registry-pubsub-lock")) {
            Map<String, Object> g = find(rows, reg, jvms);
            if (g != null) {
              double x = (Double) me.get("handoffs_per_s") / (Double) g.get("handoffs_per_s");
              md.append("; ÷ ").append(label(reg)).append(": **").append(fmt(x));
              md.append("×** hand-offs/s (≥ 5 ").append(mark(x >= 5)).append(")");
            }
          }
        }
        md.append(".\n");
      }
    }
  }

  /** The median of 1,000 PINGs on one connection: a hand-off's least overhead (ms). */
  private static double roundTripMs(Server server) {
    long[] rtt = new long[1000];
    for (int i = 0; i < rtt.length; i++) {
      long t0 = System.nanoTime();
      server.admin.ping();
      rtt[i] = System.nanoTime() - t0;
    }
    Arrays.sort(rtt);
    return rtt[rtt.length / 2] / 1e6;
  }

  /**
   * warden's two transports side by side on the contended lock, against what the hold allows: a
   * FIFO queue of T threads hands off once per hold plus the release's and the grant's trip (one
   * round trip), so at most 1 / (hold + round trip) hand-offs/s, and each waits for the T - 1 ahead
   * of it: (T - 1) / hand-offs/s, the same for every wait (p99 near p50).
   */
  private static void transports(StringBuilder md, List<Map<String, Object>> rows, double rttMs) {
    md.append("\n**warden's transports side by side** (lock, ").append(THREADS);
    md.append(" threads on one key; cap: 1 / (measured hold + one round trip, ");
    md.append(fmt(rttMs)).append(" ms by PING); FIFO wait: (").append(THREADS);
    md.append(" - 1) / hand-offs/s):\n\n");
    md.append("| JVMs × threads | transport | hand-offs/s | ÷ cap (≥ 0.95) | p50 wait ms |");
    md.append(" p99 wait ms | p99 ÷ p50 (≤ 2) | FIFO wait ms | Lettuce ÷ Jedis (≥ 1) |\n");
    md.append("|---|---|---|---|---|---|---|---|---|\n");
    for (int jvms : new int[] {1, 4}) {
      Map<String, Object> lettuce = find(rows, "warden-lettuce-lock", jvms);
      Map<String, Object> jedis = find(rows, "warden-jedis-lock", jvms);
      for (Map<String, Object> r : Arrays.asList(lettuce, jedis)) {
        if (r == null) {
          continue;
        }
        double rate = (Double) r.get("handoffs_per_s");
        double cap = 1000 / ((Double) r.get("held_ms") + rttMs);
        double p50 = (Double) r.get("p50_ms");
        double p99 = (Double) r.get("p99_ms");
        md.append("| ").append(jvms).append(" × ").append(THREADS / jvms).append(" | ");
        md.append(label((String) r.get("contender"))).append(" | ");
        md.append(String.format("%,.0f", rate)).append(" | ");
        md.append(fmt(rate / cap)).append(" ").append(mark(rate / cap >= 0.95)).append(" | ");
        md.append(fmt(p50)).append(" | ").append(fmt(p99)).append(" | ");
        md.append(fmt(p99 / p50)).append(" ").append(mark(p99 / p50 <= 2)).append(" | ");
        md.append(fmt((THREADS - 1) * 1000 / rate)).append(" | ");
        if (r == lettuce && jedis != null) {
          double x = rate / (Double) jedis.get("handoffs_per_s");
          md.append(fmt(x)).append(" ").append(mark(x >= 1));
        }
        md.append(" |\n");
      }
    }
  }

  /** 2 for 2.00, 1.5 for 1.50: a count per iteration. */
  static String fmtCount(double v) {
    return v == Math.rint(v) ? String.valueOf((long) v) : fmt(v);
  }

  static String mark(boolean ok) {
    return ok ? "✓" : "✗";
  }

  static String fmt(double v) {
    if (Double.isNaN(v)) {
      return "–";
    }
    if (Double.isInfinite(v)) {
      return "∞";
    }
    double a = Math.abs(v);
    if (a >= 100) {
      return String.format("%,.0f", v);
    }
    if (a >= 10) {
      return String.format("%.1f", v);
    }
    if (a >= 1) {
      return String.format("%.2f", v);
    }
    return String.format("%.3f", v);
  }
}
