package io.warden.bench;

import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import redis.clients.jedis.Jedis;

/** The one redis-server (with the module) that every run of a bench shares. */
final class Server implements AutoCloseable {
  final int port;
  final String binary;
  final String module;
  private final Process process;
  private final Path dir;
  final Jedis admin;

  Server(String binary, String module) throws Exception {
    this.binary = binary;
    this.module = module;
    this.dir = Files.createTempDirectory("warden-java-bench-");
    try (ServerSocket probe = new ServerSocket(0)) {
      this.port = probe.getLocalPort();
    }
    this.process =
        new ProcessBuilder(
                binary,
                "--port",
                String.valueOf(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                dir.toString(),
                "--loadmodule",
                module)
            .redirectErrorStream(true)
            .redirectOutput(dir.resolve("server.log").toFile())
            .start();
    Jedis j = null;
    for (int i = 0; i < 200 && j == null; i++) {
      try {
        Jedis c = new Jedis("127.0.0.1", port);
        c.ping();
        j = c;
      } catch (Exception e) {
        if (!process.isAlive()) {
          break;
        }
        Thread.sleep(20);
      }
    }
    if (j == null) {
      process.destroyForcibly();
      throw new IOException(
          binary
              + " with "
              + module
              + " did not start: "
              + Files.readString(dir.resolve("server.log")));
    }
    this.admin = j;
  }

  long pid() {
    return process.pid();
  }

  String version() {
    return info("server").get("redis_version");
  }

  String moduleVersion() {
    for (redis.clients.jedis.Module m : admin.moduleList()) {
      if (m.getName().equals("warden")) {
        return "warden " + m.getVersion();
      }
    }
    return "?";
  }

  Map<String, String> info(String section) {
    Map<String, String> out = new HashMap<>();
    for (String line : admin.info(section).split("\r\n")) {
      int i = line.indexOf(':');
      if (i > 0) {
        out.put(line.substring(0, i), line.substring(i + 1));
      }
    }
    return out;
  }

  /** used_cpu_sys + used_cpu_user, seconds. */
  double cpuSeconds() {
    Map<String, String> cpu = info("cpu");
    return Double.parseDouble(cpu.get("used_cpu_sys"))
        + Double.parseDouble(cpu.get("used_cpu_user"));
  }

  /** Calls per command from INFO commandstats, INFO itself left out. */
  Map<String, Long> commandCalls() {
    Map<String, Long> out = new HashMap<>();
    for (Map.Entry<String, String> e : info("commandstats").entrySet()) {
      String cmd = e.getKey().replaceFirst("^cmdstat_", "");
      if (cmd.equals("info")) {
        continue;
      }
      String v = e.getValue();
      int a = v.indexOf("calls=") + 6;
      out.put(cmd, Long.parseLong(v.substring(a, v.indexOf(',', a))));
    }
    return out;
  }

  static Map<String, Long> delta(Map<String, Long> before, Map<String, Long> after) {
    Map<String, Long> out = new HashMap<>();
    for (Map.Entry<String, Long> e : after.entrySet()) {
      long d = e.getValue() - before.getOrDefault(e.getKey(), 0L);
      if (d > 0) {
        out.put(e.getKey(), d);
      }
    }
    return out;
  }

  List<String> argv() {
    return List.of(binary, "--loadmodule", module);
  }

  @Override
  public void close() throws IOException {
    admin.close();
    process.destroy();
    try {
      process.waitFor();
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
    try (var files = Files.walk(dir)) {
      files.sorted((a, b) -> b.compareTo(a)).forEach(p -> p.toFile().delete());
    }
  }
}
