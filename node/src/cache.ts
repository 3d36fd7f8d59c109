// Cache-aside on warden's CACHE.* leases: on a miss one caller loads and the
// others wait in the server, answered with the value by the fill itself. The
// lease and its fill share one waiter connection (a lease ends with the
// connection that took it); a failing loader abandons its lease, so the next
// caller loads at once.

import type { Connections } from "./connections.js";
import { CacheWaitTimeoutError } from "./errors.js";
import { callKey } from "./keys.js";
import type { Connection } from "./transport.js";

/** How values become the strings the cache stores, and back. It must never
 * produce the empty string: that is the negative entry. */
export interface Serializer<T = unknown> {
  serialize(value: T): string;
  deserialize(data: string): T;
}

/** Values as JSON (the default): `null` is a value, `""` is `'""'`. */
export const jsonSerializer: Serializer = {
  serialize: (value) => JSON.stringify(value),
  deserialize: (data) => JSON.parse(data),
};

export interface CacheOptions {
  /** Put before every key (default `""`). */
  prefix?: string;
  /** How long one load may take, in ms: a slower loader loses its lease and
   * its fill is refused (default 10000). */
  lease?: number;
  /** How long a caller waits for another caller's load, in ms, before asking
   * again (default 10000), `retries` times (default 3). */
  wait?: number;
  retries?: number;
  /** The TTL of a loaded value, in ms (default: none), plus up to `jitter` ms
   * at random. */
  ttl?: number;
  jitter?: number;
  /** A loader answering `undefined` (nothing found) stores a negative entry
   * for this long, in ms (default 30000); readers get `undefined`. */
  negativeTtl?: number;
  serializer?: Serializer;
}

export interface LoadOptions {
  /** The value's TTL, in ms (default: the cache's). */
  ttl?: number;
  /** Up to this many ms at random added to the TTL (default: the cache's). */
  jitter?: number;
  /** Refresh ahead: a hit whose TTL is below this many ms is served, and its
   * first reader reloads it in the background. */
  refresh?: number;
  /** Gives up waiting for another caller's load. */
  signal?: AbortSignal;
}

export interface WrapOptions<A extends unknown[]> extends Omit<LoadOptions, "signal"> {
  /** The name in the keys (default: the function's name). */
  name?: string;
  /** The key of a call (default: `name` and the arguments, encoded without
   * collisions); the cache's `prefix` goes before it. */
  key?: (...args: A) => string;
}

/** A wrapped function: the same call, through the cache. */
export type Cached<A extends unknown[], T> = ((...args: A) => Promise<T | undefined>) & {
  /** Deletes the cached value of this call (or keeps it `stale` ms as stale). */
  invalidate(...args: A): Promise<boolean>;
  /** The cache key of this call. */
  keyOf(...args: A): string;
};

type Reply = [string | null, string | null];

export class Cache {
  private readonly prefix: string;
  private readonly lease: number;
  private readonly wait: number;
  private readonly retries: number;
  private readonly negativeTtl: number;
  private readonly serializer: Serializer;

  /** @internal */
  constructor(
    private readonly connections: Connections,
    private readonly options: CacheOptions = {},
  ) {
    this.prefix = options.prefix ?? "";
    this.lease = options.lease ?? 10000;
    this.wait = options.wait ?? 10000;
    this.retries = options.retries ?? 3;
    this.negativeTtl = options.negativeTtl ?? 30000;
    this.serializer = options.serializer ?? jsonSerializer;
  }

  /** The cached value of `key`, or `await loader()`'s, loaded by one caller
   * at a time across every process. `undefined` from the loader is cached as
   * a negative entry (`negativeTtl`). */
  async getOrLoad<T>(
    key: string,
    loader: () => Promise<T | undefined> | T | undefined,
    options: LoadOptions = {},
  ): Promise<T | undefined> {
    const full = this.prefix + key;
    const args: (string | number)[] = ["CACHE.GET", full, this.lease, "WAIT", this.wait];
    if (options.refresh !== undefined) args.push("REFRESH", Math.ceil(options.refresh));
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      const conn = await this.connections.take(await this.connections.nodeOf(full), options.signal);
      let kept = false;
      try {
        const [value, lease] = (await this.connections.waitOn(
          conn,
          args,
          this.wait,
          options.signal,
          undefined,
          false,
        )) as Reply;
        if (lease === null) {
          if (value !== null) return this.decode<T>(value);
          continue; // the wait timed out: ask again
        }
        if (value !== null) {
          // Refresh ahead: serve the value now, reload behind on this connection.
          kept = true;
          this.load(conn, full, lease, loader, options)
            .catch(() => {})
            .finally(() => this.connections.give(conn));
          return this.decode<T>(value);
        }
        return await this.load(conn, full, lease, loader, options);
      } finally {
        if (!kept) this.connections.give(conn);
      }
    }
    throw new CacheWaitTimeoutError(full);
  }

  /** Deletes a cached value and revokes any load in flight (a reader that
   * loaded before the write can never store its old value). With `stale`
   * (ms), keeps serving the old value that long while one caller reloads. */
  async invalidate(key: string, options: { stale?: number } = {}): Promise<boolean> {
    const full = this.prefix + key;
    const args: (string | number)[] = ["CACHE.INVALIDATE", full];
    if (options.stale !== undefined) args.push("STALE", Math.ceil(options.stale));
    return Number(await this.connections.run(full, args)) === 1;
  }

  /** `fn` through the cache: each distinct argument list is one key. */
  wrap<A extends unknown[], T>(
    fn: (...args: A) => Promise<T | undefined> | T | undefined,
    options: WrapOptions<A> = {},
  ): Cached<A, T> {
    const name = options.name ?? fn.name;
    if (options.key === undefined && !name) {
      throw new TypeError("wrap() needs a name for an anonymous function");
    }
    const keyOf = (...args: A) => options.key?.(...args) ?? callKey(name, args);
    const { ttl, jitter, refresh } = options;
    const cached = (...args: A) =>
      this.getOrLoad(keyOf(...args), () => fn(...args), { ttl, jitter, refresh });
    return Object.assign(cached, {
      invalidate: (...args: A) => this.invalidate(keyOf(...args)),
      keyOf,
    });
  }

  private decode<T>(data: string): T | undefined {
    return data === "" ? undefined : (this.serializer.deserialize(data) as T);
  }

  private async load<T>(
    conn: Connection,
    key: string,
    lease: string,
    loader: () => Promise<T | undefined> | T | undefined,
    options: LoadOptions,
  ): Promise<T | undefined> {
    let filled = false;
    try {
      const value = await loader();
      const args: (string | number)[] = ["CACHE.FILL", key, lease];
      if (value === undefined) {
        args.push("", "PX", this.negativeTtl);
      } else {
        const data = this.serializer.serialize(value);
        if (typeof data !== "string" || data === "") {
          throw new TypeError(
            "a serializer must return a non-empty string: the empty string is a negative entry",
          );
        }
        args.push(data);
        const ttl = options.ttl ?? this.options.ttl;
        const jitter = options.jitter ?? this.options.jitter;
        if (ttl !== undefined) {
          args.push("PX", Math.ceil(ttl));
          if (jitter) args.push("JITTER", Math.ceil(jitter));
        }
      }
      await conn.send(args);
      filled = true;
      // What a hit would answer, so every caller sees the same kind of value.
      return value === undefined ? undefined : this.decode<T>(String(args[3]));
    } finally {
      if (!filled && !conn.broken) {
        await conn.send(["CACHE.ABANDON", key, lease]).catch(() => {});
      }
    }
  }
}
