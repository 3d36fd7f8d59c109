package io.warden.spring.cache;

import io.warden.Transport;
import io.warden.Warden;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import org.springframework.cache.support.AbstractValueAdaptingCache;
import org.springframework.cache.support.NullValue;
import org.springframework.cache.support.SimpleValueWrapper;

/**
 * A Spring {@link org.springframework.cache.Cache} on warden's cache leases ({@code CACHE.*}).
 *
 * <p>{@link #get(Object, Callable)} — what {@code @Cacheable(sync = true)} calls — loads a cold key
 * once across every JVM: the first caller gets the key's fill lease and runs its loader; the others
 * wait on the server ({@code CACHE.GET ... WAIT}) and get the value the moment it is filled. Within
 * one JVM the callers of one key share a single server request. A loader that throws gives the
 * lease back ({@code CACHE.ABANDON}) so the next waiter loads at once; the exception reaches its
 * caller as a {@link ValueRetrievalException}.
 *
 * <p>Entries are plain Redis strings under {@code prefix + key} ({@code cacheName::key} by
 * default), readable with {@code GET}. {@link #put} is {@code SET} (which revokes a load in flight,
 * so an older loaded value cannot overwrite it); {@link #evict} is {@code CACHE.INVALIDATE}, which
 * also revokes a load in flight.
 *
 * <p>{@link #clear()} walks the keyspace with {@code SCAN MATCH prefix*} and invalidates each key
 * it finds: O(number of keys in the database), one command per entry. Keep it off hot paths.
 */
public class WardenCache extends AbstractValueAdaptingCache {
  private static final byte[] NULL_BYTES =
      CacheValueSerializer.java().serialize(NullValue.INSTANCE);

  private final String name;
  private final Transport transport;
  private final io.warden.WardenCache leases;
  private final WardenCacheConfiguration config;

  /** The loads in flight in this JVM, one per key: the other callers of the key wait for it. */
  private final ConcurrentHashMap<String, CompletableFuture<byte[]>> loading =
      new ConcurrentHashMap<>();

  public WardenCache(String name, Warden warden, WardenCacheConfiguration config) {
    super(config.getAllowCacheNullValues());
    this.name = name;
    this.transport = warden.transport();
    this.leases = warden.cache();
    this.config = config;
  }

  @Override
  public String getName() {
    return name;
  }

  /** The {@link Warden} cache leases this cache uses. */
  @Override
  public Object getNativeCache() {
    return leases;
  }

  public WardenCacheConfiguration getCacheConfiguration() {
    return config;
  }

  @Override
  protected Object lookup(Object key) {
    byte[] bytes = (byte[]) call(bytes("GET"), serverKey(key));
    return bytes == null ? null : decode(bytes);
  }

  @Override
  @SuppressWarnings("unchecked")
  public <T> T get(Object key, Callable<T> valueLoader) {
    String k = new String(serverKey(key), StandardCharsets.UTF_8);
    return (T) fromStoreValue(decode(load(key, k, valueLoader)));
  }

  private byte[] load(Object key, String k, Callable<?> valueLoader) {
    CompletableFuture<byte[]> mine = new CompletableFuture<>();
    while (true) {
      CompletableFuture<byte[]> other = loading.putIfAbsent(k, mine);
      if (other == null) {
        break;
      }
      try {
        return other.get();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new ValueRetrievalException(key, valueLoader, e);
      } catch (ExecutionException e) {
        if (e.getCause() instanceof LeaderInterrupted) {
          continue; // its caller was interrupted, not this one: load again
        }
        throw rethrow(key, valueLoader, e.getCause());
      }
    }
    try {
      byte[] bytes = leases.getOrLoad(k, config.getTtl(), () -> encodeLoaded(key, valueLoader));
      mine.complete(bytes);
      return bytes;
    } catch (InterruptedException e) {
      mine.completeExceptionally(new LeaderInterrupted());
      Thread.currentThread().interrupt();
      throw new ValueRetrievalException(key, valueLoader, e);
    } catch (Throwable e) {
      mine.completeExceptionally(e);
      throw rethrow(key, valueLoader, e);
    } finally {
      loading.remove(k, mine);
    }
  }

  private byte[] encodeLoaded(Object key, Callable<?> valueLoader) {
    Object value;
    try {
      value = valueLoader.call();
    } catch (Exception e) {
      // Wrapped here, so the caller can tell the loader's failure from the server's.
      throw new ValueRetrievalException(key, valueLoader, e);
    }
    return encode(toStoreValue(value));
  }

  private static RuntimeException rethrow(Object key, Callable<?> loader, Throwable e) {
    if (e instanceof RuntimeException) {
      return (RuntimeException) e;
    }
    if (e instanceof Error) {
      throw (Error) e;
    }
    return new ValueRetrievalException(key, loader, e);
  }

  /** The load of another caller in this JVM ended by its interrupt: the waiters try again. */
  private static final class LeaderInterrupted extends RuntimeException {
    private static final long serialVersionUID = 1L;

    LeaderInterrupted() {
      super(null, null, false, false);
    }
  }

  @Override
  public void put(Object key, Object value) {
    call(setArgs(key, value));
  }

  @Override
  public ValueWrapper putIfAbsent(Object key, Object value) {
    List<byte[]> args = new ArrayList<>(Arrays.asList(setArgs(key, value)));
    args.add(bytes("NX"));
    args.add(bytes("GET"));
    byte[] old = (byte[]) call(args.toArray(new byte[0][]));
    return old == null ? null : new SimpleValueWrapper(fromStoreValue(decode(old)));
  }

  private byte[][] setArgs(Object key, Object value) {
    byte[] bytes = encode(toStoreValue(value));
    long ttl = config.getTtl().toMillis();
    return ttl > 0
        ? new byte[][] {bytes("SET"), serverKey(key), bytes, bytes("PX"), bytes(Long.toString(ttl))}
        : new byte[][] {bytes("SET"), serverKey(key), bytes};
  }

  @Override
  public void evict(Object key) {
    call(bytes("CACHE.INVALIDATE"), serverKey(key));
  }

  @Override
  public boolean evictIfPresent(Object key) {
    return Long.valueOf(1).equals(call(bytes("CACHE.INVALIDATE"), serverKey(key)));
  }

  @Override
  public void clear() {
    invalidate();
  }

  /**
   * Invalidates every entry of this cache: {@code SCAN MATCH prefix* COUNT 1000} over the whole
   * keyspace, {@code CACHE.INVALIDATE} per key found (pipelined per batch). A load in flight for a
   * key that has no value yet is not revoked.
   *
   * @return whether any entry was there
   */
  @Override
  public boolean invalidate() {
    if (!config.usePrefix()) {
      throw new IllegalStateException(
          "cache '"
              + name
              + "' has no key prefix: clearing it would delete every key of the database");
    }
    byte[] pattern = bytes(globEscape(config.getKeyPrefixFor(name)) + "*");
    byte[] cursor = bytes("0");
    boolean any = false;
    do {
      List<?> reply =
          (List<?>)
              call(bytes("SCAN"), cursor, bytes("MATCH"), pattern, bytes("COUNT"), bytes("1000"));
      cursor = (byte[]) reply.get(0);
      List<CompletableFuture<Object>> pending = new ArrayList<>();
      for (Object k : (List<?>) reply.get(1)) {
        pending.add(transport.execute(bytes("CACHE.INVALIDATE"), (byte[]) k).toCompletableFuture());
      }
      for (CompletableFuture<Object> p : pending) {
        any |= Long.valueOf(1).equals(join(p));
      }
    } while (!Arrays.equals(cursor, bytes("0")));
    return any;
  }

  private static String globEscape(String s) {
    StringBuilder sb = new StringBuilder();
    for (char c : s.toCharArray()) {
      if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') {
        sb.append('\\');
      }
      sb.append(c);
    }
    return sb.toString();
  }

  private byte[] encode(Object storeValue) {
    if (storeValue == NullValue.INSTANCE) {
      return NULL_BYTES;
    }
    return config.getSerializer().serialize(storeValue);
  }

  private Object decode(byte[] bytes) {
    if (isAllowNullValues() && Arrays.equals(bytes, NULL_BYTES)) {
      return NullValue.INSTANCE;
    }
    return config.getSerializer().deserialize(bytes);
  }

  /** The server key of {@code key}: the cache's prefix, then the key as a string. */
  protected byte[] serverKey(Object key) {
    return bytes(config.getKeyPrefixFor(name) + convertKey(key));
  }

  /**
   * The key as a string: itself for a {@link String}, else its {@code toString()} when its class
   * declares one (numbers, enums, {@code SimpleKey}, records...).
   */
  protected String convertKey(Object key) {
    if (key instanceof String s) {
      return s;
    }
    try {
      if (key.getClass().getMethod("toString").getDeclaringClass() != Object.class) {
        return key.toString();
      }
    } catch (NoSuchMethodException e) {
      // every class has toString()
    }
    throw new IllegalStateException(
        "cannot use "
            + key.getClass().getName()
            + " as a cache key: it has no toString() of its own (override it, or use a key"
            + " generator that makes strings)");
  }

  private Object call(byte[]... args) {
    return join(transport.execute(args).toCompletableFuture());
  }

  private static Object join(CompletableFuture<Object> f) {
    try {
      return f.join();
    } catch (CompletionException e) {
      throw e.getCause() instanceof RuntimeException r ? r : e;
    }
  }

  private static byte[] bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  /** The TTL of this cache's entries ({@code Duration.ZERO}: none). */
  public Duration getTtl() {
    return config.getTtl();
  }
}
