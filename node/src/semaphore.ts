// Semaphores held in the server (SEM.*): at most `limit` permits at once,
// each hold with its own lease and fencing token, and a FIFO queue that a
// small request never overtakes. Acquire, give-back, leases and the watchdog
// are the locks' own.

import "./dispose.js";
import type { Connections } from "./connections.js";
import { LockBusyError, SemaphoreLimitError } from "./errors.js";
import {
  type AcquireOptions,
  type Grant,
  Lock,
  type LockDefaults,
  type LockKind,
  type Made,
  type Routine,
  grant,
  handOver,
  runHolding,
} from "./lock.js";
import { replyFields } from "./transport.js";

const SEMAPHORE: LockKind = {
  acquire: "SEM.ACQUIRE",
  release: "SEM.RELEASE",
  extend: "SEM.EXTEND",
  releasedFrom: 1,
};

export interface SemaphoreAcquireOptions extends AcquireOptions {
  /** Permits for this hold (default 1), from 1 to the limit. */
  permits?: number;
}

/** What `SEM.INFO` reports of a semaphore. */
export interface SemaphoreInfo {
  /** The bound on the permits held at once. */
  limit: number;
  /** The permits held now (above `limit` for a while after it was lowered). */
  used: number;
  /** The owners holding permits. */
  holders: number;
  /** The requests queued. */
  waiters: number;
}

function checkCount(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new RangeError(`${name} must be an integer from 1, not ${value}`);
  }
  return value;
}

/** Permits held on a semaphore: a `Lock` (fence, lease, watchdog, `lost`,
 * `extend()`, `release()`, `await using`) that also knows its `permits`. */
export class Permit extends Lock {
  /** @internal */
  constructor(
    connections: Connections,
    key: string,
    owner: string,
    fence: bigint,
    ttl: number,
    watchdog: boolean,
    granted: number,
    /** The permits this hold has. */
    readonly permits: number,
    asked: number = ttl,
  ) {
    super(connections, SEMAPHORE, key, owner, fence, ttl, watchdog, granted, asked);
  }
}

/** One semaphore: `warden.semaphore(key, limit)`. */
export class Semaphore {
  private stated: number;

  /** @internal */
  constructor(
    private readonly connections: Connections,
    /** The semaphore's key. */
    readonly key: string,
    limit: number,
    private readonly defaults: LockDefaults,
  ) {
    this.stated = checkCount("limit", limit);
  }

  /** The limit this object's acquires state. */
  get limit(): number {
    return this.stated;
  }

  /** Waits in the server's queue (FIFO: never overtaken, not even by a
   * request for fewer permits) up to `wait` ms (default: until granted or
   * aborted); `LockBusyError` if not granted in time. Without `ttl`, a 30 s
   * lease renewed by a watchdog until release. */
  acquire(options: SemaphoreAcquireOptions = {}): Promise<Permit> {
    return this.take(options, (made) => {
      const permit = handOver(made);
      if (permit === null) throw new LockBusyError(this.key);
      return permit;
    });
  }

  /** The permits, or null when they are not free (default: no wait). */
  tryAcquire(options: SemaphoreAcquireOptions = {}): Promise<Permit | null> {
    return this.take({ wait: 0, ...options }, handOver);
  }

  /** Runs `routine` holding permits with a `ttl` ms lease renewed until it
   * ends; `signal` aborts if the hold is lost. Releases when it settles. */
  using<T>(ttl: number, routine: Routine<T, Permit>): Promise<T>;
  using<T>(ttl: number, options: SemaphoreAcquireOptions, routine: Routine<T, Permit>): Promise<T>;
  async using<T>(
    ttl: number,
    options: SemaphoreAcquireOptions | Routine<T, Permit>,
    routine?: Routine<T, Permit>,
  ): Promise<T> {
    const [opts, fn] =
      typeof options === "function" ? [{}, options] : [options, routine as Routine<T, Permit>];
    return runHolding(await this.acquire({ watchdog: true, ...opts, ttl }), fn);
  }

  /** Changes the semaphore's limit (`SEM.SETLIMIT`), and the limit this
   * object's acquires state. Waiters that now fit are granted at once; holds
   * above a lowered limit run to their release or lease end, and queued
   * requests for more permits than `limit` fail. False: no semaphore exists
   * (nobody holds permits), and the next acquire creates it with `limit`. */
  async setLimit(limit: number): Promise<boolean> {
    const n = checkCount("limit", limit);
    const changed = await this.connections.run(this.key, ["SEM.SETLIMIT", this.key, n]);
    this.stated = n;
    return Number(changed) === 1;
  }

  /** The semaphore's state (`SEM.INFO`), or null if it does not exist. */
  async info(): Promise<SemaphoreInfo | null> {
    const fields = replyFields(await this.connections.run(this.key, ["SEM.INFO", this.key]));
    if (fields === null) return null;
    const field = (name: string) => fields.get(name) ?? 0;
    return {
      limit: field("limit"),
      used: field("used"),
      holders: field("holders"),
      waiters: field("waiters"),
    };
  }

  /** The permits asked for, made into a hold and handed to `hand` in the
   * same step (one promise between the grant and the caller). */
  private take<R>(
    options: SemaphoreAcquireOptions,
    hand: (made: Made<Permit> | null) => R,
  ): Promise<R> {
    let permits: number;
    let granted: Promise<Grant | null>;
    try {
      permits = checkCount("permits", options.permits ?? 1);
      const extra = ["LIMIT", this.stated, "PERMITS", permits];
      granted = grant(this.connections, SEMAPHORE, this.key, options, this.defaults, extra);
    } catch (error) {
      return Promise.reject(error);
    }
    return granted.then(
      (g) => {
        if (g === null) return hand(null);
        const hold = new Permit(
          this.connections,
          this.key,
          g.owner,
          g.fence,
          g.ttl,
          g.watchdog,
          g.granted,
          permits,
          g.asked,
        );
        return hand({ grant: g, hold });
      },
      (error: unknown) => {
        throw SemaphoreLimitError.from(error);
      },
    );
  }
}
