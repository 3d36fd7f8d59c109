package io.warden.bench;

import io.lettuce.core.RedisClient;
import io.warden.Warden;
import io.warden.lettuce.LettuceTransport;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.time.Duration;
import java.util.concurrent.Callable;

/**
 * The near-cache bench's warden contender in Java: {@code NearCache.builder(warden).build()} (its
 * defaults) on the Lettuce transport, a read being {@code getOrLoadString(key, ttl, loader)} (the
 * loader, never expected to run, throws). Bound through a {@code static final MethodHandle} so that
 * this module builds before warden-core has {@code io.warden.NearCache} (branch near-java): until
 * then it exits with a message. Once it has, calls straight to it can replace the handles (a
 * constant handle's invokeExact is inlined by the JIT, so the hit latency barely differs).
 */
final class WardenNear {
  private static final MethodHandle BUILDER;
  private static final MethodHandle BUILD;
  private static final MethodHandle GET;
  private static final MethodHandle CLOSE;

  static {
    MethodHandle builder = null, build = null, get = null, close = null;
    try {
      Class<?> near = Class.forName("io.warden.NearCache");
      Class<?> b = Class.forName("io.warden.NearCache$Builder");
      MethodHandles.Lookup l = MethodHandles.publicLookup();
      builder =
          l.findStatic(near, "builder", MethodType.methodType(b, Warden.class))
              .asType(MethodType.methodType(Object.class, Warden.class));
      build =
          l.findVirtual(b, "build", MethodType.methodType(near))
              .asType(MethodType.methodType(Object.class, Object.class));
      get =
          l.findVirtual(
                  near,
                  "getOrLoadString",
                  MethodType.methodType(String.class, String.class, Duration.class, Callable.class))
              .asType(
                  MethodType.methodType(
                      String.class, Object.class, String.class, Duration.class, Callable.class));
      close =
          l.findVirtual(near, "close", MethodType.methodType(void.class))
              .asType(MethodType.methodType(void.class, Object.class));
    } catch (ReflectiveOperationException e) {
      // not in this checkout's warden-core yet
    }
    BUILDER = builder;
    BUILD = build;
    GET = get;
    CLOSE = close;
  }

  private WardenNear() {}

  static void run(int port, String prefix, int nKeys, double seconds, int hits) throws Throwable {
    if (GET == null) {
      System.err.println(
          "warden's Java near cache is not in this checkout yet (near-java not merged)");
      System.exit(2);
    }
    RedisClient client = RedisClient.create("redis://127.0.0.1:" + port);
    Warden warden = Warden.create(LettuceTransport.create(client));
    Object near = (Object) BUILD.invokeExact((Object) BUILDER.invokeExact(warden));
    Duration ttl = Duration.ofMinutes(5);
    Callable<String> loader =
        () -> {
          throw new IllegalStateException("the loader ran: the key is missing");
        };
    NearCache.hitsAndRace(
        key -> Long.parseLong((String) GET.invokeExact(near, key, ttl, loader)),
        prefix,
        nKeys,
        seconds,
        hits,
        "System.nanoTime() around each read (NearCache.getOrLoadString through a MethodHandle)",
        () -> {
          try {
            CLOSE.invokeExact(near);
          } catch (Throwable e) {
            // closing at the end of the run
          }
          client.shutdown();
        });
  }
}
