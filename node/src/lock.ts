// Locks held in the server: exclusive (LOCK.*) and the two sides of a
// read-write lock (RWLOCK.*). An acquire tries once on the shared connection;
// a busy lock is waited for in the server's FIFO queue, on a waiter connection
// of its own, until the caller's deadline; every grant carries a fencing token.

import "./dispose.js";
import { randomBytes } from "node:crypto";
import { type Connections, TIMED_OUT, later, sleep, within } from "./connections.js";
import {
  ConnectionError,
  LockBusyError,
  LockLostError,
  ReplyError,
  abortReason,
} from "./errors.js";
import { checkFlag, checkKey, checkSignal } from "./keys.js";
import type { Args } from "./transport.js";

/** The commands behind one kind of lock (or semaphore). */
export interface LockKind {
  readonly acquire: string;
  readonly release: string;
  readonly extend: string;
  /** The least release reply that means the hold was still ours. */
  readonly releasedFrom: number;
}

export const EXCLUSIVE: LockKind = {
  acquire: "LOCK.ACQUIRE",
  release: "LOCK.RELEASE",
  extend: "LOCK.EXTEND",
  releasedFrom: 0,
};
export const READ: LockKind = {
  acquire: "RWLOCK.READ",
  release: "RWLOCK.UNLOCK",
  extend: "RWLOCK.EXTEND",
  releasedFrom: 0,
};
export const WRITE: LockKind = {
  acquire: "RWLOCK.WRITE",
  release: "RWLOCK.UNLOCK",
  extend: "RWLOCK.EXTEND",
  releasedFrom: 0,
};

export interface AcquireOptions {
  /** The lease, in ms. Without it the lease is `watchdogLease` (30 s),
   * renewed by a watchdog until release. */
  ttl?: number;
  /** Renew the lease (`ttl`) every third of it until release (default: true
   * when `ttl` is not given). */
  watchdog?: boolean;
  /** How long to wait for a busy lock, in ms: `0` does not wait, `Infinity`
   * (the default) waits until granted or aborted. */
  wait?: number;
  /** Aborting gives up the wait (and gives back a grant already on its way). */
  signal?: AbortSignal;
  /** Load shedding: when this many requests already wait for the key, do
   * not queue — answer as a timeout at once (the server's `QUEUE n`). */
  maxQueue?: number;
}

/** A routine run under a lock: `signal` aborts if the lock is lost. */
export type Routine<T, L extends Lock = Lock> = (signal: AbortSignal, lock: L) => Promise<T>;

/** Defaults shared by the locks of one `Warden`. */
export interface LockDefaults {
  watchdogLease: number;
}

// Random bytes drawn 256 owners at a time: one call into the system's
// random source per 256 acquisitions, not one each.
const OWNER_BYTES = 16;
let ownerPool = Buffer.alloc(0);
let ownerAt = 0;

/** A random owner: a fresh one per acquisition (16 bytes, hex). */
export function freshOwner(): string {
  if (ownerAt + OWNER_BYTES > ownerPool.length) {
    ownerPool = randomBytes(OWNER_BYTES * 256);
    ownerAt = 0;
  }
  ownerAt += OWNER_BYTES;
  return ownerPool.toString("hex", ownerAt - OWNER_BYTES, ownerAt);
}

// The server's warden.max-lease, as learnt from its refusals, per Warden's
// connections (a lower cap learnt later replaces it).
const caps = new WeakMap<Connections, number>();
const CAP = /ttl exceeds warden\.max-lease: expected an integer from 1 to (\d+)/;

/** The cap in the server's refusal of a lease above `warden.max-lease`
 * (`ERR ttl exceeds warden.max-lease: expected an integer from 1 to N (ms)`). */
function leaseCapOf(error: unknown): number | undefined {
  if (!(error instanceof ReplyError)) return undefined;
  const match = CAP.exec(error.message);
  return match === null ? undefined : Number(match[1]);
}

/** `ms`, or the cap learnt for `connections` when that is lower. */
function capped(connections: Connections, ms: number): number {
  const cap = caps.get(connections);
  return cap === undefined ? ms : Math.min(ms, cap);
}

/** Sends `args` (whose lease is `args[at]`); a refusal above the server's
 * cap (nothing was done) teaches the cap, and `args` go again at it. */
function underCap<T>(
  connections: Connections,
  args: (string | number)[],
  at: number,
  send: () => Promise<T>,
  attempt = 0,
): Promise<T> {
  let sent: Promise<T>;
  try {
    sent = send();
  } catch (error) {
    sent = Promise.reject(error);
  }
  // No async frame of its own: on the path of every acquire.
  return sent.catch((error: unknown) => {
    if (!learnCap(connections, args, at, error, attempt)) throw error;
    return underCap(connections, args, at, send, attempt + 1);
  });
}

/** After `error` answered `args` (the `attempt`th time): true when it
 * refused the lease `args[at]` above the server's cap (nothing was done),
 * which is then learnt and put in `args` to go again. */
function learnCap(
  connections: Connections,
  args: (string | number)[],
  at: number,
  error: unknown,
  attempt: number,
): boolean {
  const cap = leaseCapOf(error);
  if (cap === undefined || cap >= Number(args[at]) || attempt >= 2) return false;
  caps.set(connections, cap);
  args[at] = cap;
  return true;
}

function checkMs(name: string, value: number, zero: boolean): number {
  if (value === Number.POSITIVE_INFINITY && name === "wait") return value;
  if (!Number.isFinite(value) || value < (zero ? 0 : 1)) {
    throw new RangeError(`${name} must be a number of ms from ${zero ? 0 : 1}, not ${value}`);
  }
  return Math.ceil(value);
}

/** A held lock: one grant, to one fresh owner. */
export class Lock implements AsyncDisposable {
  /** Why the lock was lost (set once, when it is). */
  private lostWhy: LockLostError | undefined;
  /** `lost`'s controller, made when `lost` is first read: most holds are
   * released without anyone listening. */
  private lostController: AbortController | undefined;
  private released = false;
  private timer: (() => void) | undefined;
  /** A fixed lease whose end no timer watches (nobody listens to `lost`):
   * it is noticed when the hold is asked about. */
  private unwatched = false;
  private deadline: number;
  /** The lease asked for (`extend()`'s default): above the server's cap,
   * `ttl` is the cap and the hold is renewed until `end`. */
  private asked: number;
  /** Capped and renewed: when the lease asked for ends. */
  private end: number | undefined;

  /** @internal */
  constructor(
    private readonly connections: Connections,
    private readonly kind: LockKind,
    /** The lock's key. */
    readonly key: string,
    /** The owner the server knows this holder by. */
    readonly owner: string,
    /** The fencing token of this grant: higher than every earlier grant's.
     * A bigint: exact beyond 2^53. */
    readonly fence: bigint,
    private ttl: number,
    private readonly watchdog: boolean,
    granted: number,
    asked: number = ttl,
  ) {
    this.deadline = granted + ttl;
    this.asked = asked;
    this.end = !watchdog && asked > ttl ? granted + asked : undefined;
    this.schedule();
  }

  /** Aborted (with a `LockLostError`) when the lock is lost: its lease ended,
   * the watchdog could not renew it, or the key was deleted or overwritten. */
  get lost(): AbortSignal {
    if (this.lostController === undefined) {
      this.lostController = new AbortController();
      this.noticeEnd();
      if (this.lostWhy !== undefined) this.lostController.abort(this.lostWhy);
      else if (this.unwatched) this.schedule(); // now a timer tells the end
    }
    return this.lostController.signal;
  }

  /** True until released or lost. */
  get held(): boolean {
    this.noticeEnd();
    return !this.released && this.lostWhy === undefined;
  }

  /** Resets the lease to `ttl` ms from now (default: the lease it was taken
   * with). Above the server's `warden.max-lease` it is capped and renewed
   * until then. Throws `LockLostError` if the lock is no longer ours. */
  async extend(lease: number = this.asked): Promise<void> {
    const ttl = checkMs("ttl", lease, false);
    if (!this.held) throw this.notHeld();
    let started = performance.now();
    const args = [this.kind.extend, this.key, this.owner, capped(this.connections, ttl)];
    let renewed: unknown;
    try {
      renewed = await underCap(this.connections, args, 3, () => {
        started = performance.now();
        return this.connections.run(this.key, args);
      });
    } catch (error) {
      if (!isWrongType(error)) throw error;
      renewed = "0";
    }
    if (Number(renewed) !== 1) {
      this.lose("it is no longer held by this owner");
      throw this.notHeld();
    }
    const sent = Number(args[3]);
    this.ttl = sent;
    this.asked = ttl;
    this.end = !this.watchdog && ttl > sent ? started + ttl : undefined;
    this.deadline = started + sent;
    this.schedule();
  }

  /** Gives the lock up. Throws `LockLostError` if it was no longer ours
   * (it had been lost already). Releasing twice is a no-op. After
   * `warden.close()` the release goes out on a connection of its own. A
   * release that fails without its reply (the connection broke) is sent once
   * more in the background on a new connection, and the error thrown. */
  async release(): Promise<void> {
    if (this.released) return;
    // An unwatched lease that ended is told as such (its reply is then 0).
    const ended = this.unwatched ? this.deadline : Number.POSITIVE_INFINITY;
    this.released = true;
    this.stop();
    const args = [this.kind.release, this.key, this.owner];
    let reply: unknown;
    try {
      // At once: the next grant (another caller's, maybe) waits for it.
      reply = await this.connections.giveBack(this.key, args);
    } catch (error) {
      if (!isWrongType(error)) {
        // It may not have run: the lock would stay held by nobody until its
        // lease ends. The owner is this hold's alone (one hold), so sending
        // it again ends this hold or answers that there is none.
        if (!(error instanceof ReplyError)) {
          this.connections.background(this.connections.giveBack(this.key, args));
        }
        throw error;
      }
      reply = "-1";
    }
    if (Number(reply) < this.kind.releasedFrom) {
      if (performance.now() >= ended) this.lose("its lease ended");
      this.lose("it was no longer held by this owner when released");
      throw this.notHeld();
    }
  }

  /** @internal A hold its caller can no longer take: given back in the background. */
  abandon(): void {
    this.released = true;
    this.stop();
    const { key, owner } = this;
    this.connections.background(this.connections.giveBack(key, [this.kind.release, key, owner]));
  }

  /** `await using lock = await warden.lock(...)`: releases at the end of the
   * block; a lock lost meanwhile is not an error here (`lost` told). */
  async [Symbol.asyncDispose](): Promise<void> {
    try {
      await this.release();
    } catch (error) {
      if (!(error instanceof LockLostError)) throw error;
    }
  }

  private notHeld(): LockLostError {
    return this.lostWhy !== undefined
      ? this.lostWhy
      : new LockLostError(this.key, this.released ? "released" : "no longer held");
  }

  private lose(why: string): void {
    this.stop();
    if (this.lostWhy !== undefined) return;
    this.lostWhy = new LockLostError(this.key, why);
    this.lostController?.abort(this.lostWhy);
  }

  private stop(): void {
    this.timer?.();
    this.timer = undefined;
    this.unwatched = false;
  }

  /** An unwatched fixed lease that has ended: lost now, as its timer would
   * have told. */
  private noticeEnd(): void {
    if (this.unwatched && performance.now() >= this.deadline) this.lose("its lease ended");
  }

  /** The next renewal (watchdog, or a lease capped below the one asked
   * for), or the moment the lease ends (fixed lease, or the last renewal
   * of a capped one). */
  private schedule(): void {
    this.stop();
    if (!this.held) return;
    if (this.watchdog || (this.end !== undefined && this.end > this.deadline)) {
      const now = performance.now();
      const pause = Math.max(1, Math.min(this.ttl / 3, (this.deadline - now) / 2));
      this.timer = later(pause, () => this.renew(), true);
    } else if (this.lostController === undefined) {
      // Nobody listens to `lost` yet: no timer per hold (most are released
      // well before their lease ends).
      this.unwatched = true;
    } else {
      this.timer = later(
        Math.max(0, this.deadline - performance.now()),
        () => this.lose("its lease ended"),
        true,
      );
    }
  }

  private async renew(): Promise<void> {
    this.timer = undefined;
    if (!this.held) return;
    if (performance.now() >= this.deadline) {
      this.lose("its lease ended before it could be renewed");
      return;
    }
    let started = performance.now();
    // Capped and renewed: the last renewal asks only for what remains.
    const lease =
      this.end === undefined
        ? this.ttl
        : Math.max(1, Math.min(this.ttl, Math.floor(this.end - started)));
    const args = [this.kind.extend, this.key, this.owner, lease];
    let renewed: unknown;
    try {
      // A cap lowered at run time: learnt from the refusal, renewed at it.
      renewed = await underCap(this.connections, args, 3, () => {
        started = performance.now();
        return this.connections.run(this.key, args);
      });
    } catch (error) {
      if (isWrongType(error)) {
        this.lose("the key now holds another type");
        return;
      }
      renewed = undefined; // try again sooner, while the lease lasts
    }
    if (!this.held) return;
    if (renewed === undefined) {
      if (performance.now() >= this.deadline) {
        this.lose("its lease ended before it could be renewed");
      } else {
        this.schedule();
      }
      return;
    }
    if (Number(renewed) !== 1) {
      this.lose("it is no longer held by this owner");
      return;
    }
    const sent = Number(args[3]);
    if (sent < lease) this.ttl = sent; // the cap was lowered
    this.deadline = started + sent;
    this.schedule();
  }
}

function isWrongType(error: unknown): boolean {
  return error instanceof ReplyError && error.message.startsWith("WRONGTYPE");
}

/** What the server granted one acquire. */
export interface Grant {
  owner: string;
  fence: bigint;
  /** The lease granted: at most the server's cap. */
  ttl: number;
  /** The lease asked for (above `ttl`: capped and renewed). */
  asked: number;
  watchdog: boolean;
  /** When the lease started, as far as this client can tell (`performance.now()`). */
  granted: number;
  /** The caller's deadline (`performance.now()` time; `Infinity`: none). */
  deadline: number;
  signal: AbortSignal | undefined;
}

/** A hold made of a grant, not yet handed to its caller. */
export interface Made<L extends Lock> {
  grant: Grant;
  hold: L;
}

/** The hold, if its caller can still take it: checked in the last step
 * before the caller resumes, after every hold of a burst of grants was made
 * (a burst must not hand a grant over past its deadline). Otherwise it is
 * given back, and the call reports its abort or timeout. */
export function handOver<L extends Lock>(made: Made<L> | null): L | null {
  if (made === null) return null;
  const { grant: g, hold } = made;
  if (
    g.signal?.aborted ||
    (g.deadline < Number.POSITIVE_INFINITY && performance.now() > g.deadline)
  ) {
    hold.abandon();
    if (g.signal?.aborted) throw abortReason(g.signal);
    return null;
  }
  return hold;
}

const closedError = () => new ConnectionError("warden is closed");

/** Checks `maxQueue`: the `QUEUE n` of a waiting request. */
export function checkQueue(value: number | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isSafeInteger(value) || value < 0 || value > 2 ** 46) {
    throw new RangeError(`maxQueue must be an integer from 0 to 2^46, not ${value}`);
  }
  return value;
}

/** Sends one acquire of `kind` (`extra`: its options after the ttl); null
 * when not granted within `wait`.
 *
 * It first tries without waiting on the shared command connection: a free
 * lock is granted in one round trip. Only a busy one waits, on a waiter
 * connection, with `WAIT` = what remains of `wait` (measured from this
 * call) less the reply's trip. A grant that reaches this client after the
 * deadline or an abort, or that crosses a broken connection, is given back
 * at once: no caller is ever handed a grant past its deadline. */
export async function grant(
  connections: Connections,
  kind: LockKind,
  key: string,
  options: AcquireOptions,
  defaults: LockDefaults,
  extra: Args = [],
): Promise<Grant | null> {
  const started = performance.now();
  checkKey(key);
  const watchdog = checkFlag("watchdog", options.watchdog) ?? options.ttl === undefined;
  const ttl = checkMs("ttl", options.ttl ?? defaults.watchdogLease, false);
  const wait = checkMs("wait", options.wait ?? Number.POSITIVE_INFINITY, true);
  const queue = checkQueue(options.maxQueue);
  const signal = checkSignal(options.signal);
  const deadline = started + wait;
  const owner = freshOwner();
  const args: (string | number)[] = [kind.acquire, key, owner, capped(connections, ttl), ...extra];
  const release = () =>
    connections.background(connections.giveBack(key, [kind.release, key, owner]));
  // A grant this caller can no longer take: given back, reported as the
  // abort or timeout it is.
  const refuse = () => {
    release();
    if (signal?.aborted) throw abortReason(signal);
    return null;
  };
  if (signal?.aborted) throw abortReason(signal);
  if (connections.isClosed) throw closedError();
  const limit = wait > 0 ? deadline : Number.POSITIVE_INFINITY;

  // A request of this process already queued for the key: the server would
  // answer the try nil (it never overtakes a waiter), so go straight to waiting.
  if (wait === 0 || !connections.queued(kind.acquire, key)) {
    // A failure that is not the server's answer: the try may have been granted.
    const lost = (error: unknown) => {
      if (!(error instanceof ReplyError)) giveBack(connections, kind, key, owner, undefined);
    };
    let fence: unknown;
    try {
      fence = await underCap(connections, args, 3, () => {
        const tried = connections.run(key, args);
        // The try too ends at the caller's deadline (a stalled server, a slow
        // connection): a grant that comes later is given back.
        // Without a deadline or a signal nothing can end the try early.
        return wait === 0 || (wait === Number.POSITIVE_INFINITY && signal === undefined)
          ? tried
          : within(
              tried,
              deadline,
              signal,
              (late) => {
                if (late !== null && late !== undefined) release();
              },
              lost,
            );
      });
    } catch (error) {
      lost(error);
      throw connections.isClosed && error instanceof ConnectionError ? closedError() : error;
    }
    if (fence === TIMED_OUT) return null;
    if (fence !== null && fence !== undefined) {
      if (connections.isClosed) {
        refuse();
        throw closedError();
      }
      if (signal?.aborted || performance.now() > limit) return refuse();
      return {
        owner,
        fence: BigInt(String(fence)),
        ttl: Number(args[3]),
        asked: ttl,
        watchdog,
        granted: started,
        deadline: limit,
        signal,
      };
    }
    if (wait === 0) return null;
  }

  const build = (waitMs: number) => {
    const command = [...args, "WAIT", waitMs];
    if (queue !== undefined) command.push("QUEUE", queue);
    return command;
  };
  const late = (reply: unknown) => {
    if (reply !== null && reply !== undefined && !(reply instanceof Error)) release();
  };
  const abandoned = (clientId: string) => giveBack(connections, kind, key, owner, clientId);
  let reply: unknown;
  for (let attempt = 0; ; attempt++) {
    try {
      reply = await connections.wait(key, build, deadline, signal, late, abandoned);
      break;
    } catch (error) {
      if (learnCap(connections, args, 3, error, attempt)) continue;
      throw connections.isClosed && error instanceof ConnectionError ? closedError() : error;
    }
  }
  if (reply === TIMED_OUT || reply === null || reply === undefined) return null;
  if (connections.isClosed) {
    refuse();
    throw closedError();
  }
  // The lease runs from the grant: at most the reply's trip ago.
  const granted = performance.now();
  if (signal?.aborted || granted > deadline) return refuse();
  return {
    owner,
    fence: BigInt(String(reply)),
    ttl: Number(args[3]),
    asked: ttl,
    watchdog,
    granted,
    deadline,
    signal,
  };
}

/** One lock of `kind`, made but not handed over; null when not granted within `wait`. */
async function make(
  connections: Connections,
  kind: LockKind,
  key: string,
  options: AcquireOptions,
  defaults: LockDefaults,
): Promise<Made<Lock> | null> {
  const g = await grant(connections, kind, key, options, defaults);
  if (g === null) return null;
  const hold = new Lock(
    connections,
    kind,
    key,
    g.owner,
    g.fence,
    g.ttl,
    g.watchdog,
    g.granted,
    g.asked,
  );
  return { grant: g, hold };
}

/** Acquires one lock of `kind`; null when not granted within `wait`. */
export async function acquire(
  connections: Connections,
  kind: LockKind,
  key: string,
  options: AcquireOptions,
  defaults: LockDefaults,
): Promise<Lock | null> {
  return handOver(await make(connections, kind, key, options, defaults));
}

/** Runs `routine` holding `lock`; releases it when the routine settles (a
 * lock lost meanwhile is not an error here: `signal` told). */
export async function runHolding<T, L extends Lock>(lock: L, routine: Routine<T, L>): Promise<T> {
  try {
    return await routine(lock.lost, lock);
  } finally {
    await lock.release().catch((error: unknown) => {
      if (!(error instanceof LockLostError)) throw error;
    });
  }
}

/** Throws `LockBusyError` instead of answering null. */
export async function acquireOrThrow(
  connections: Connections,
  kind: LockKind,
  key: string,
  options: AcquireOptions,
  defaults: LockDefaults,
): Promise<Lock> {
  const lock = handOver(await make(connections, kind, key, options, defaults));
  if (lock === null) throw new LockBusyError(key);
  return lock;
}

/** An acquire gave up (aborted, timed out, connection lost) with its reply
 * unread: a grant may be on its way to the fresh owner. Release it — at once
 * (a grant already sent), and again once the server has seen the waiter's
 * connection go (a grant made in between). Owner-checked: it never touches
 * anyone else's hold. */
function giveBack(
  connections: Connections,
  kind: LockKind,
  key: string,
  owner: string,
  clientId: string | undefined,
): void {
  const release = () => connections.giveBack(key, [kind.release, key, owner]);
  connections.background(
    (async () => {
      if (Number(await release()) === 1 || clientId === undefined) return;
      // Unconfirmed (no id, CLIENT refused): give the server a moment.
      if (!(await connections.gone(await connections.nodeOf(key), clientId, 4000))) {
        await sleep(50);
      }
      await release();
    })(),
  );
}

/** Both sides of one read-write lock. */
export class ReadWriteLock {
  /** @internal */
  constructor(
    private readonly connections: Connections,
    /** The lock's key. */
    readonly key: string,
    private readonly defaults: LockDefaults,
  ) {}

  /** A shared read lock (`RWLOCK.READ`); `LockBusyError` if not granted within `wait`. */
  read(options: AcquireOptions = {}): Promise<Lock> {
    return acquireOrThrow(this.connections, READ, this.key, options, this.defaults);
  }

  /** The exclusive write lock (`RWLOCK.WRITE`); `LockBusyError` if not granted within `wait`. */
  write(options: AcquireOptions = {}): Promise<Lock> {
    return acquireOrThrow(this.connections, WRITE, this.key, options, this.defaults);
  }

  /** A read lock, or null when busy after `wait` (default: no wait). */
  tryRead(options: AcquireOptions = {}): Promise<Lock | null> {
    return acquire(this.connections, READ, this.key, { wait: 0, ...options }, this.defaults);
  }

  /** The write lock, or null when busy after `wait` (default: no wait). */
  tryWrite(options: AcquireOptions = {}): Promise<Lock | null> {
    return acquire(this.connections, WRITE, this.key, { wait: 0, ...options }, this.defaults);
  }
}
