package io.warden.spring;

import io.warden.testing.RedisServer;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** Reads {@code LOCK.INFO} / {@code CACHE.INFO} replies as maps, for assertions. */
public final class ServerInfo {
  private ServerInfo() {}

  /** The reply of {@code command key} as field -> value (null: the reply was nil). */
  public static Map<String, Object> info(RedisServer server, String command, String key) {
    Object r = server.call(command, key);
    if (r == null) {
      return null;
    }
    List<?> list = (List<?>) r;
    Map<String, Object> map = new LinkedHashMap<>();
    for (int i = 0; i + 1 < list.size(); i += 2) {
      Object v = list.get(i + 1);
      map.put(
          new String((byte[]) list.get(i), StandardCharsets.UTF_8),
          v instanceof byte[] b ? new String(b, StandardCharsets.UTF_8) : v);
    }
    return map;
  }

  public static Map<String, Object> lockInfo(RedisServer server, String key) {
    return info(server, "LOCK.INFO", key);
  }

  /** Waits (up to 10 s) until {@code key}'s lock has {@code n} waiters. */
  public static void awaitWaiters(RedisServer server, String key, long n) {
    long end = System.nanoTime() + 10_000_000_000L;
    while (true) {
      Map<String, Object> info = lockInfo(server, key);
      if (info != null && Long.valueOf(n).equals(info.get("waiters"))) {
        return;
      }
      if (System.nanoTime() > end) {
        throw new AssertionError("no " + n + " waiter(s) on " + key + ": " + info);
      }
      try {
        Thread.sleep(5);
      } catch (InterruptedException e) {
        throw new AssertionError(e);
      }
    }
  }
}
