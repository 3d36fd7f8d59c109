package io.warden.bench;

import io.lettuce.core.RedisClient;
import io.warden.NearCache;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import java.time.Duration;
import java.util.concurrent.Callable;

/**
 * The near-cache bench's warden contender in Java: {@code NearCache.builder(warden).build()} (its
 * defaults) on the Lettuce transport, a read being {@code getOrLoadString(key, ttl, loader)} (the
 * keys are plain strings the bench's writer SETs; the loader, never expected to run, throws).
 */
final class WardenNear {
  private WardenNear() {}

  static void run(int port, String prefix, int nKeys, double seconds, int hits) throws Throwable {
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
    Warden warden = Warden.create(LettuceTransport.create(client));
    NearCache near = NearCache.builder(warden).build();
    Duration ttl = Duration.ofMinutes(5);
    Callable<String> loader =
        () -> {
          throw new IllegalStateException("the loader ran: the key is missing");
        };
    NearCache.Stats before = near.stats();
    NearCacheBench.hitsAndRace(
        key -> Long.parseLong(near.getOrLoadString(key, ttl, loader)),
        prefix,
        nKeys,
        seconds,
        hits,
        "System.nanoTime() around each read",
        () -> {
          NearCache.Stats after = near.stats();
          System.err.println(
              "near cache: "
                  + (after.hits() - before.hits())
                  + " hits, "
                  + (after.misses() - before.misses())
                  + " misses");
          near.close();
          client.shutdown();
        });
  }
}
