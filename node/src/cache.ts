// Cache-aside on warden's CACHE.* leases: on a miss one caller loads and the
// others wait in the server, answered with the value by the fill itself. A
// lease ends with the connection that took it, so its fill goes on that one
// (the shared connection, or the waiter connection a waited lease came on);
// a failing loader abandons its lease, so the next caller loads at once.

import { type Connections, TIMED_OUT, serverWait } from "./connections.js";
import { CacheWaitTimeoutError, abortReason } from "./errors.js";
import { callKey, checkKey, checkSignal } from "./keys.js";
import { checkQueue } from "./lock.js";
import type { NearCache, NearCacheOptions } from "./near.js";
import type { Args } from "./transport.js";

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
  /** Load shedding: when this many callers already wait for a key's load,
   * do not queue (the server's `QUEUE n`); such a wait counts as timed out. */
  maxQueue?: number;
  /** A near cache: values also kept in this process and served with no
   * round trip until the server invalidates them (`true`: the default
   * bounds, 10000 values and 64 MiB). See "Near cache" in the docs. */
  near?: boolean | NearCacheOptions;
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
  private readonly maxQueue: number | undefined;

  /** The near cache, if the cache has one (`near` option). */
  readonly near: NearCache | undefined;

  /** @internal */
  constructor(
    private readonly connections: Connections,
    private readonly options: CacheOptions = {},
    near?: NearCache,
  ) {
    this.near = near;
    this.prefix = checkKey(options.prefix ?? "", "prefix");
    this.lease = options.lease ?? 10000;
    this.wait = options.wait ?? 10000;
    this.retries = options.retries ?? 3;
    this.negativeTtl = options.negativeTtl ?? 30000;
    this.serializer = options.serializer ?? jsonSerializer;
    this.maxQueue = checkQueue(options.maxQueue);
  }

  /** The cached value of `key`, or `await loader()`'s, loaded by one caller
   * at a time across every process. `undefined` from the loader is cached as
   * a negative entry (`negativeTtl`).
   *
   * A hit, or a miss that this caller loads, takes one round trip on the
   * shared connection; only a miss another caller is loading waits (up to
   * `wait`, in the server's queue, on a waiter connection). */
  async getOrLoad<T>(
    key: string,
    loader: () => Promise<T | undefined> | T | undefined,
    options: LoadOptions = {},
  ): Promise<T | undefined> {
    const full = this.prefix + checkKey(key);
    const args: (string | number)[] = ["CACHE.GET", full, this.lease];
    if (options.refresh !== undefined) args.push("REFRESH", Math.ceil(options.refresh));
    const signal = checkSignal(options.signal);
    const near = this.near;
    if (near !== undefined) {
      const held = near.get(full, options.refresh) ?? (await near.peek(full, options.refresh));
      if (held !== undefined) return this.decode<T>(held);
      // Nothing fresh in the server: the lease path, as without a near cache.
    }
    const shared = (command: Args) => this.connections.run(full, command);
    for (let attempt = 0; attempt <= this.retries; attempt++) {
      if (signal?.aborted) throw abortReason(signal);
      const [value, lease] = (await this.connections.run(full, args)) as Reply;
      if (lease !== null) return this.served(full, value, lease, loader, options, shared);
      if (value !== null) return this.decode<T>(value);
      // Another caller is loading: wait for its fill.
      const deadline = performance.now() + this.wait;
      const node = await this.connections.nodeOf(full);
      const conn = await this.connections.take(node, signal, deadline);
      if (conn === null) continue;
      const waitMs = serverWait(deadline);
      if (waitMs === null) {
        this.connections.give(conn);
        continue;
      }
      const command = [...args, "WAIT", waitMs];
      if (this.maxQueue !== undefined) command.push("QUEUE", this.maxQueue);
      const reply = (await this.connections.waitOn(
        conn,
        command,
        waitMs,
        deadline,
        signal,
        (late) => {
          // A lease nobody will use: the next waiter gets one at once.
          const token = (late as Reply | null)?.[1];
          if (token !== null && token !== undefined) {
            this.connections.background(shared(["CACHE.ABANDON", full, token]));
          }
        },
        () => {}, // a lease taken on a closed connection ended with it
      )) as Reply | typeof TIMED_OUT;
      if (reply === TIMED_OUT) continue;
      const [waited, waitedLease] = reply;
      if (waitedLease === null) {
        this.connections.give(conn);
        if (waited !== null) return this.decode<T>(waited);
        continue; // the wait timed out (or was shed): ask again
      }
      // A lease handed on to this waiter ends with its connection: the
      // connection is kept until the fill.
      const send = (command: Args) => conn.send(command);
      const done = () => this.connections.give(conn);
      return this.served(full, waited, waitedLease, loader, options, send, done);
    }
    throw new CacheWaitTimeoutError(full);
  }

  /** A reply that carries a lease: load (a miss), or serve the value and
   * reload behind (refresh ahead). `done` runs when the lease is settled. */
  private async served<T>(
    key: string,
    value: string | null,
    lease: string,
    loader: () => Promise<T | undefined> | T | undefined,
    options: LoadOptions,
    send: (command: Args) => Promise<unknown>,
    done: () => void = () => {},
  ): Promise<T | undefined> {
    if (value !== null) {
      this.load(send, key, lease, loader, options)
        .catch(() => {})
        .finally(done);
      return this.decode<T>(value);
    }
    try {
      return await this.load(send, key, lease, loader, options);
    } finally {
      done();
    }
  }

  /** Deletes a cached value and revokes any load in flight (a reader that
   * loaded before the write can never store its old value). With `stale`
   * (ms), keeps serving the old value that long while one caller reloads. */
  async invalidate(key: string, options: { stale?: number } = {}): Promise<boolean> {
    const full = this.prefix + checkKey(key);
    const args: (string | number)[] = ["CACHE.INVALIDATE", full];
    if (options.stale !== undefined) args.push("STALE", Math.ceil(options.stale));
    // Dropped here before and after: a read that peeked before the server
    // ran the invalidation keeps nothing, even if its reply is read after
    // the acknowledgement and before the server's push.
    this.near?.drop(full);
    try {
      return Number(await this.connections.run(full, args)) === 1;
    } finally {
      this.near?.drop(full);
    }
  }

  /** With a near cache: one round trip on its connection, after which every
   * invalidation the server sent before is applied (a write acknowledged
   * before `sync()` is seen by every read after it). Without: nothing. */
  async sync(): Promise<void> {
    await this.near?.sync();
  }

  /** Closes the near cache's connection (`Warden.close()` does too). */
  async close(): Promise<void> {
    await this.near?.close();
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
    send: (command: Args) => Promise<unknown>,
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
      await send(args);
      filled = true;
      // What a hit would answer, so every caller sees the same kind of value.
      return value === undefined ? undefined : this.decode<T>(String(args[3]));
    } finally {
      if (!filled) await send(["CACHE.ABANDON", key, lease]).catch(() => {});
    }
  }
}
