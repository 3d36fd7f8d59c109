import "./dispose.js";
import { Cache, type CacheOptions } from "./cache.js";
import { type ConnectionOptions, Connections } from "./connections.js";
import { checkKey } from "./keys.js";
import {
  type AcquireOptions,
  EXCLUSIVE,
  type Lock,
  type LockDefaults,
  ReadWriteLock,
  type Routine,
  acquire,
  acquireOrThrow,
  runHolding,
} from "./lock.js";
import { NearCache, endpointOf } from "./near.js";
import { RateLimiter, type RateLimiterOptions } from "./rate.js";
import { Semaphore } from "./semaphore.js";
import { type Client, transportFor } from "./transport.js";

export type { Routine } from "./lock.js";

export interface WardenOptions extends Partial<ConnectionOptions> {
  /** The lease of a lock taken without `ttl`, renewed by its watchdog every
   * third of it until release (ms; default 30000). */
  watchdogLease?: number;
}

/**
 * warden's locks and cache for one ioredis or node-redis client (a `Redis`
 * or `Cluster` of ioredis; a client, pool or cluster of node-redis).
 *
 * The client is the template of warden's own connections: one per node for
 * tries, releases and renewals (to a single server, opened at once), and up
 * to `maxWaiters` for waits (opened only when a lock is busy), never the
 * application's. A wait that finds them all
 * taken waits for one only until its deadline. `close()` closes them (the
 * client stays yours).
 */
export class Warden implements AsyncDisposable {
  private readonly connections: Connections;
  private readonly defaults: LockDefaults;
  private readonly client: Client;
  private readonly nears = new Set<NearCache>();

  constructor(client: Client, options: WardenOptions = {}) {
    this.client = client;
    this.connections = new Connections(transportFor(client), {
      maxWaiters: options.maxWaiters ?? 128,
      maxIdleWaiters: options.maxIdleWaiters ?? 16,
      readMargin: options.readMargin ?? 5000,
    });
    this.defaults = { watchdogLease: options.watchdogLease ?? 30000 };
    this.connections.warm();
  }

  /** Takes the exclusive lock `key` (`LOCK.ACQUIRE`), waiting in the
   * server's queue up to `wait` ms (default: until granted or aborted).
   * Throws `LockBusyError` if not granted in time. */
  lock(key: string, options: AcquireOptions = {}): Promise<Lock> {
    return acquireOrThrow(this.connections, EXCLUSIVE, key, options, this.defaults);
  }

  /** The lock `key`, or null when busy (default: no wait). */
  tryLock(key: string, options: AcquireOptions = {}): Promise<Lock | null> {
    return acquire(this.connections, EXCLUSIVE, key, { wait: 0, ...options }, this.defaults);
  }

  /**
   * Runs `routine` holding the lock `key`, with a `ttl` ms lease renewed
   * until it ends (redlock's `using`); `signal` aborts if the lock is lost.
   * Releases when the routine settles.
   */
  using<T>(key: string, ttl: number, routine: Routine<T>): Promise<T>;
  using<T>(key: string, ttl: number, options: AcquireOptions, routine: Routine<T>): Promise<T>;
  async using<T>(
    key: string,
    ttl: number,
    options: AcquireOptions | Routine<T>,
    routine?: Routine<T>,
  ): Promise<T> {
    const [opts, fn] =
      typeof options === "function" ? [{}, options] : [options, routine as Routine<T>];
    return runHolding(await this.lock(key, { watchdog: true, ...opts, ttl }), fn);
  }

  /** The read-write lock `key` (`RWLOCK.*`): `.read()` and `.write()`. */
  readWriteLock(key: string): ReadWriteLock {
    return new ReadWriteLock(this.connections, checkKey(key), this.defaults);
  }

  /** The semaphore `key` (`SEM.*`): at most `limit` permits held at once.
   * Every acquire states `limit`; the server refuses another one while the
   * semaphore exists (`SemaphoreLimitError`): `setLimit()` changes it. */
  semaphore(key: string, limit: number): Semaphore {
    return new Semaphore(this.connections, checkKey(key), limit, this.defaults);
  }

  /** The rate limiter `key` (`RATE.*`): `count` tokens every `period` ms, at
   * most `burst` (default `count`) at once. Every request states the rate;
   * the server refuses another one while the limiter exists
   * (`RateMismatchError`): `setRate()` changes it. */
  rateLimiter(key: string, options: RateLimiterOptions): RateLimiter {
    return new RateLimiter(this.connections, checkKey(key), options);
  }

  /** A cache on warden's leases (`CACHE.*`); with `near`, values are also
   * kept in this process (one connection of its own per near cache). */
  cache(options: CacheOptions = {}): Cache {
    if (options.near === undefined || options.near === false) {
      return new Cache(this.connections, options);
    }
    const near = new NearCache(endpointOf(this.client), options.near === true ? {} : options.near);
    this.nears.add(near);
    return new Cache(this.connections, options, near);
  }

  /** Closes warden's own connections, near caches' too (waits in progress fail). */
  async close(): Promise<void> {
    await Promise.all([...this.nears].map((near) => near.close()));
    this.nears.clear();
    await this.connections.close();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
