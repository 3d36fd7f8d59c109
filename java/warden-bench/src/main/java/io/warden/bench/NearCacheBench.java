package io.warden.bench;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import org.redisson.Redisson;
import org.redisson.api.RLocalCachedMap;
import org.redisson.api.RedissonClient;
import org.redisson.api.options.LocalCachedMapOptions;
import org.redisson.client.codec.StringCodec;
import org.redisson.config.Config;

/**
 * The near-cache bench's Java driver (bench/near_cache.py runs it; {@code make bench
 * SECTION=near-cache}). One run of one client against a server with the module.
 *
 * <p>{@code --client redisson}: Redisson's {@code RLocalCachedMap} with its defaults ({@code
 * LocalCachedMapOptions.name(…)}, sync strategy INVALIDATE over its pub/sub), the map named PREFIX,
 * fields 0 … keys-1 and "hit". It stores a hash, so a plain {@code SET} cannot write it: the writer
 * is a second RedissonClient (its own connections) in this JVM, on a thread of its own, writing n+1
 * with {@code fastPut} on its own RLocalCachedMap of the same name, RATE writes per second over the
 * fields in turn, noting (field, n, System.nanoTime()) after each acknowledgement. {@code --client
 * warden}: warden's Java near cache ({@link WardenNear}), keys PREFIX:0 … and PREFIX:hit that the
 * bench's writer SETs.
 *
 * <p>Protocol as bench/near_cache_python.py: warm-up, hit latency (HITS reads of "hit", each timed
 * alone with System.nanoTime, the timer included), READY; on GO the race (one reader thread,
 * System.nanoTime: CLOCK_MONOTONIC on Linux, as the other drivers'), then {@code RESULT {json}}
 * with the reads run-length coded and the writer's acks.
 */
public final class NearCacheBench {
  static final long BUCKET_NS = 2_000;

  public static void main(String[] argv) throws Throwable {
    Map<String, String> a = new HashMap<>();
    for (int i = 0; i < argv.length; i++) {
      if (argv[i].equals("--version")) {
        System.out.println(
            "{\"redisson\": \""
                + Redisson.class.getPackage().getImplementationVersion()
                + "\", \"java\": \""
                + System.getProperty("java.version")
                + "\"}");
        return;
      }
      a.put(argv[i].substring(2), argv[++i]);
    }
    int port = Integer.parseInt(a.get("port"));
    String prefix = a.get("prefix");
    int nKeys = Integer.parseInt(a.getOrDefault("keys", "4"));
    double seconds = Double.parseDouble(a.getOrDefault("seconds", "5"));
    int hits = Integer.parseInt(a.getOrDefault("hits", "200000"));
    double rate = Double.parseDouble(a.getOrDefault("rate", "400"));
    if ("warden".equals(a.get("client"))) {
      WardenNear.run(port, prefix, nKeys, seconds, hits);
      return;
    }
    if (!"redisson".equals(a.get("client"))) {
      System.err.println("--client: redisson or warden");
      System.exit(2);
    }

    RedissonClient readerClient = client(port);
    RedissonClient writerClient = client(port);
    RLocalCachedMap<String, String> map = map(readerClient, prefix);
    RLocalCachedMap<String, String> wmap = map(writerClient, prefix);
    String[] keys = new String[nKeys];
    for (int i = 0; i < nKeys; i++) {
      keys[i] = String.valueOf(i);
      wmap.fastPut(keys[i], "0");
    }
    wmap.fastPut("hit", "0");
    for (int i = 0; i < 20_000; i++) {
      map.get("hit");
      for (String k : keys) map.get(k);
    }
    long[] lat = new long[hits];
    for (int i = 0; i < hits; i++) {
      long t0 = System.nanoTime();
      map.get("hit");
      lat[i] = System.nanoTime() - t0;
    }
    Arrays.sort(lat);
    System.out.println("READY");
    System.out.flush();
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line = in.readLine();
    if (line == null || !line.trim().equals("GO")) return;

    long runNs = (long) (seconds * 1e9);
    List<long[]> acks = new ArrayList<>();
    Thread writer =
        new Thread(
            () -> {
              long[] n = new long[nKeys];
              long period = (long) (1e9 / rate);
              long t0 = System.nanoTime();
              for (long j = 0; ; j++) {
                long due = t0 + j * period;
                if (due >= t0 + runNs) break;
                long wait = due - System.nanoTime();
                if (wait > 0) java.util.concurrent.locks.LockSupport.parkNanos(wait);
                int i = (int) (j % nKeys);
                n[i]++;
                wmap.fastPut(keys[i], String.valueOf(n[i]));
                long ack = System.nanoTime();
                synchronized (acks) {
                  acks.add(new long[] {i, n[i], ack});
                }
              }
            });
    List<long[]> entries = new ArrayList<>();
    long[][] cur = new long[nKeys][];
    long reads = 0;
    long tStart = System.nanoTime();
    writer.start();
    long end = tStart + runNs;
    int i = 0;
    for (; ; ) {
      long t = System.nanoTime();
      if (t >= end) break;
      long v = Long.parseLong(map.get(keys[i]));
      long[] e = cur[i];
      if (e != null && e[1] == v && t - e[2] <= BUCKET_NS) {
        e[3] = t;
        e[4]++;
      } else {
        e = new long[] {i, v, t, t, 1};
        entries.add(e);
        cur[i] = e;
      }
      reads++;
      i = (i + 1) % nKeys;
    }
    long tEnd = System.nanoTime();
    writer.join();
    StringBuilder out = new StringBuilder("RESULT {\"reads\": ").append(reads);
    out.append(", \"seconds\": ").append((tEnd - tStart) / 1e9);
    out.append(", \"hit_ns_p50\": ").append(lat[hits / 2]);
    out.append(", \"hit_ns_p99\": ").append(lat[Math.min(hits - 1, (int) (hits * 0.99))]);
    out.append(", \"hits\": ").append(hits);
    out.append(", \"timer\": \"System.nanoTime() around each read\"");
    out.append(", \"writer_sent\": ").append(acks.size());
    out.append(", \"entries\": ");
    list(out, entries);
    out.append(", \"acks\": ");
    list(out, acks);
    out.append("}");
    System.out.println(out);
    System.out.flush();
    readerClient.shutdown();
    writerClient.shutdown();
    System.exit(0);
  }

  /** The race's reader and its RESULT line, for any read function (acks: the writer's, or none). */
  interface Read {
    long get(String key) throws Throwable;
  }

  static void hitsAndRace(
      Read read, String prefix, int nKeys, double seconds, int hits, String timer, Runnable close)
      throws Throwable {
    String[] keys = new String[nKeys];
    for (int i = 0; i < nKeys; i++) keys[i] = prefix + ":" + i;
    String hit = prefix + ":hit";
    for (int i = 0; i < 20_000; i++) {
      read.get(hit);
      for (String k : keys) read.get(k);
    }
    long[] lat = new long[hits];
    for (int i = 0; i < hits; i++) {
      long t0 = System.nanoTime();
      read.get(hit);
      lat[i] = System.nanoTime() - t0;
    }
    Arrays.sort(lat);
    System.out.println("READY");
    System.out.flush();
    BufferedReader in =
        new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    String line = in.readLine();
    if (line == null || !line.trim().equals("GO")) return;
    List<long[]> entries = new ArrayList<>();
    long[][] cur = new long[nKeys][];
    long reads = 0;
    long tStart = System.nanoTime();
    long end = tStart + (long) (seconds * 1e9);
    int i = 0;
    for (; ; ) {
      long t = System.nanoTime();
      if (t >= end) break;
      long v = read.get(keys[i]);
      long[] e = cur[i];
      if (e != null && e[1] == v && t - e[2] <= BUCKET_NS) {
        e[3] = t;
        e[4]++;
      } else {
        e = new long[] {i, v, t, t, 1};
        entries.add(e);
        cur[i] = e;
      }
      reads++;
      i = (i + 1) % nKeys;
    }
    long tEnd = System.nanoTime();
    StringBuilder out = new StringBuilder("RESULT {\"reads\": ").append(reads);
    out.append(", \"seconds\": ").append((tEnd - tStart) / 1e9);
    out.append(", \"hit_ns_p50\": ").append(lat[hits / 2]);
    out.append(", \"hit_ns_p99\": ").append(lat[Math.min(hits - 1, (int) (hits * 0.99))]);
    out.append(", \"hits\": ").append(hits);
    out.append(", \"timer\": \"").append(timer).append('"');
    out.append(", \"entries\": ");
    list(out, entries);
    out.append("}");
    System.out.println(out);
    System.out.flush();
    close.run();
    System.exit(0);
  }

  static RedissonClient client(int port) {
    Config config = new Config();
    config.useSingleServer().setAddress("redis://127.0.0.1:" + port);
    return Redisson.create(config);
  }

  static RLocalCachedMap<String, String> map(RedissonClient c, String name) {
    return c.getLocalCachedMap(
        LocalCachedMapOptions.<String, String>name(name).codec(StringCodec.INSTANCE));
  }

  static void list(StringBuilder out, List<long[]> xs) {
    out.append('[');
    for (int j = 0; j < xs.size(); j++) {
      if (j > 0) out.append(',');
      out.append('[');
      long[] x = xs.get(j);
      for (int k = 0; k < x.length; k++) {
        if (k > 0) out.append(',');
        out.append(x[k]);
      }
      out.append(']');
    }
    out.append(']');
  }
}
