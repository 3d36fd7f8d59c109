// Rate limiters held in the server (RATE.*): `count` tokens every `period`
// ms, at most `burst` at once (GCRA, computed exactly by the server). An
// acquire tries once on the shared connection; a limited answer whose tokens
// conform before the caller's deadline waits in the server's FIFO queue, on
// a waiter connection, exactly as a busy lock does (`Connections.wait`).

import { type Connections, TIMED_OUT, within } from "./connections.js";
import { ConnectionError, RateMismatchError, ReplyError, abortReason } from "./errors.js";
import { checkSignal } from "./keys.js";
import { checkQueue } from "./lock.js";
import { type Args, replyFields } from "./transport.js";

/** A limiter's rate: `count` tokens every `period` ms, at most `burst`
 * (default `count`) at once. */
export interface Rate {
  /** Tokens every `period`: 1 to 1000000 per ms of the period. */
  count: number;
  /** The period, in whole ms: 1 to 86400000 (a day). */
  period: number;
  /** The most tokens taken at once (the bucket's size); default `count`. */
  burst?: number;
}

export interface RateLimiterOptions extends Rate {
  /** How long `acquire` waits in the server's queue by default, in ms: `0`
   * does not wait, `Infinity` (the default) waits until the tokens conform
   * or the call is aborted. */
  wait?: number;
  /** Load shedding: when this many requests already wait for the key,
   * `acquire` answers at once, limited, instead of queueing (the server's
   * `QUEUE n`). */
  maxQueue?: number;
}

export interface RateAcquireOptions {
  /** How long to wait for the tokens, in ms (default: the limiter's). */
  wait?: number;
  /** Aborting gives up the wait: the request leaves the server's queue and
   * takes nothing (a grant already on its way is given back). */
  signal?: AbortSignal;
}

/** A limiter's answer to one request (`RATE.ACQUIRE`'s five integers). */
export interface RateDecision {
  /** The tokens were taken. */
  allowed: boolean;
  /** The limiter's burst (its bucket's size). */
  burst: number;
  /** Whole tokens left. */
  remaining: number;
  /** Ms until the request would conform (counting the requests that wait
   * ahead), when it was not allowed; null when allowed, or when a wait
   * ended without an answer (its deadline passed first). */
  retryAfter: number | null;
  /** Ms until the bucket is full again. */
  resetAfter: number;
}

/** What `RATE.INFO` reports of a limiter. */
export interface RateInfo {
  count: number;
  /** The rate's period, in ms. */
  period: number;
  burst: number;
  /** Whole tokens available now. */
  remaining: number;
  /** Ms until the bucket is full again. */
  resetAfter: number;
  /** Requests waiting in the limiter's queue. */
  waiters: number;
}

function checkInteger(name: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) {
    throw new RangeError(`${name} must be an integer from 1, not ${value}`);
  }
  return value;
}

function checkRate(rate: Rate): Rate {
  const count = checkInteger("count", rate.count);
  const period = checkInteger("period (whole ms)", rate.period);
  return rate.burst === undefined
    ? { count, period }
    : { count, period, burst: checkInteger("burst", rate.burst) };
}

function checkWait(value: number): number {
  if (value === Number.POSITIVE_INFINITY) return value;
  if (!Number.isFinite(value) || value < 0) {
    throw new RangeError(`wait must be a number of ms from 0, or Infinity, not ${value}`);
  }
  return Math.ceil(value);
}

/** `RATE.ACQUIRE`'s reply: `[limited, burst, remaining, retry_after,
 * reset_after]` (ms; `retry_after` -1 when taken). */
export function decisionOf(reply: unknown): RateDecision {
  if (!Array.isArray(reply) || reply.length !== 5) {
    throw new ReplyError(`RATE.ACQUIRE answered ${JSON.stringify(reply)}, not five integers`);
  }
  const [limited, burst, remaining, retry, reset] = reply.map(Number) as [
    number,
    number,
    number,
    number,
    number,
  ];
  return {
    allowed: limited === 0,
    burst,
    remaining: Math.max(0, remaining),
    retryAfter: limited !== 0 && retry >= 0 ? retry : null,
    resetAfter: Math.max(0, reset),
  };
}

/** A reply that took tokens. */
function isGrant(reply: unknown): boolean {
  return Array.isArray(reply) && reply.length === 5 && Number(reply[0]) === 0;
}

const closedError = () => new ConnectionError("warden is closed");

/** One rate limiter: `warden.rateLimiter(key, { count, period, burst })`.
 *
 * Every request states the rate; while the limiter exists the server
 * refuses another one (`RateMismatchError`), so that two versions of a
 * service cannot silently disagree on the bound: `setRate()` changes it on
 * purpose. */
export class RateLimiter {
  private rate: Rate;
  private readonly wait: number;
  private readonly maxQueue: number | undefined;

  /** @internal */
  constructor(
    private readonly connections: Connections,
    /** The limiter's key. */
    readonly key: string,
    options: RateLimiterOptions,
  ) {
    this.rate = checkRate(options);
    this.wait = checkWait(options.wait ?? Number.POSITIVE_INFINITY);
    this.maxQueue = checkQueue(options.maxQueue);
  }

  /** Tokens every `period`, as this object's requests state them. */
  get count(): number {
    return this.rate.count;
  }

  /** The rate's period (ms), as this object's requests state it. */
  get period(): number {
    return this.rate.period;
  }

  /** The burst this object's requests state (undefined: the server's
   * default, `count`). */
  get burst(): number | undefined {
    return this.rate.burst;
  }

  /** Takes `cost` tokens: at once if they conform (and nobody waits ahead),
   * else after waiting in the server's FIFO queue (never overtaken, not
   * even by a request for fewer tokens) up to `wait` ms. A request that
   * cannot conform in time is answered at once, limited, with its
   * `retryAfter`; one whose deadline passes first, limited with `retryAfter`
   * null. Aborting rejects with the signal's reason and takes nothing (on
   * Redis before 7.4, a grant written just before the abort closed the
   * waiter's connection is spent by nobody). */
  async acquire(cost = 1, options: RateAcquireOptions = {}): Promise<RateDecision> {
    return this.take(cost, checkWait(options.wait ?? this.wait), checkSignal(options.signal));
  }

  /** Takes `cost` tokens if they conform now and nobody waits ahead. */
  async tryAcquire(cost = 1): Promise<RateDecision> {
    return this.take(cost, 0, undefined);
  }

  /** Gives `cost` tokens back (`RATE.REFUND`): a reservation whose work did
   * not happen. Never beyond a full bucket; the waiters that now conform
   * are served. False: no limiter (its bucket is full). */
  async refund(cost: number): Promise<boolean> {
    const n = checkInteger("cost", cost);
    return Number(await this.connections.run(this.key, ["RATE.REFUND", this.key, n])) === 1;
  }

  /** Changes the limiter's rate (`RATE.CONFIG`), keeping the tokens it
   * owes, and the rate this object's requests state from now on. Waiters
   * that stated the old rate fail (`ReplyError`). False: no limiter exists
   * (its bucket is full), and the next request creates it at the new rate. */
  async setRate(rate: Rate): Promise<boolean> {
    const next = checkRate(rate);
    const changed = await this.connections.run(this.key, this.stated("RATE.CONFIG", next));
    this.rate = next;
    return Number(changed) === 1;
  }

  /** The limiter's state (`RATE.INFO`), or null when there is none (its
   * bucket is full and nobody waits). */
  async info(): Promise<RateInfo | null> {
    const fields = replyFields(await this.connections.run(this.key, ["RATE.INFO", this.key]));
    if (fields === null) return null;
    const field = (name: string) => fields.get(name) ?? 0;
    return {
      count: field("count"),
      period: field("period"),
      burst: field("burst"),
      remaining: field("remaining"),
      resetAfter: field("reset_after"),
      waiters: field("waiters"),
    };
  }

  /** `command key count period [BURST burst]`: every request states the rate. */
  private stated(command: string, rate: Rate = this.rate): (string | number)[] {
    const args: (string | number)[] = [command, this.key, rate.count, rate.period];
    if (rate.burst !== undefined) args.push("BURST", rate.burst);
    return args;
  }

  /** Not allowed, no retry-after known: a wait that ended unanswered, or a
   * grant that came too late and was given back. */
  private unanswered(burst = this.rate.burst ?? Math.min(this.rate.count, 1e9)): RateDecision {
    return { allowed: false, burst, remaining: 0, retryAfter: null, resetAfter: 0 };
  }

  /** One acquire of `cost` tokens within `wait` ms. A grant that reaches
   * this client after the deadline or an abort is given back at once
   * (`RATE.REFUND`): only a grant read, never a guess, so a give-back never
   * returns tokens nobody took. A grant lost with a closed connection took
   * tokens nobody used: fewer admitted, never more. */
  private async take(
    cost: number,
    wait: number,
    signal: AbortSignal | undefined,
  ): Promise<RateDecision> {
    const n = checkInteger("cost", cost);
    const { connections, key } = this;
    const started = performance.now();
    const deadline = started + wait;
    const args = [...this.stated("RATE.ACQUIRE"), "COST", n];
    const refund = () => connections.background(connections.giveBack(key, ["RATE.REFUND", key, n]));
    const late = (reply: unknown) => {
      if (isGrant(reply)) refund();
    };
    // A grant this caller can no longer take: given back, reported as the
    // abort or timeout it is.
    const refuse = (burst: number) => {
      refund();
      if (signal?.aborted) throw abortReason(signal);
      return this.unanswered(burst);
    };
    const failed = (error: unknown) => {
      const e = RateMismatchError.from(error);
      return connections.isClosed && e instanceof ConnectionError ? closedError() : e;
    };
    if (signal?.aborted) throw abortReason(signal);
    if (connections.isClosed) throw closedError();

    let burst: number | undefined;
    // A request of this process already queued for the key: the server
    // would answer the try limited (it never overtakes a waiter), so go
    // straight to waiting (the server answers at once what cannot conform).
    if (wait === 0 || !connections.queued("RATE.ACQUIRE", key)) {
      let reply: unknown;
      try {
        const tried = connections.run(key, args);
        // The try too ends at the caller's deadline or abort; a grant that
        // comes later is given back. Without either nothing can end it early.
        reply =
          wait === 0 || (wait === Number.POSITIVE_INFINITY && signal === undefined)
            ? await tried
            : await within(tried, deadline, signal, late);
      } catch (error) {
        throw failed(error);
      }
      if (reply === TIMED_OUT) return this.unanswered();
      const first = decisionOf(reply);
      if (first.allowed) {
        if (signal?.aborted || (wait > 0 && performance.now() > deadline)) {
          return refuse(first.burst);
        }
        return first;
      }
      if (wait === 0) return first;
      // Cannot conform in time: waiting would be answered the same at once.
      if (first.retryAfter !== null && first.retryAfter > deadline - performance.now()) {
        return first;
      }
      burst = first.burst;
    }

    const queue = this.maxQueue;
    let reply: unknown;
    try {
      reply = await connections.wait(
        key,
        (waitMs): Args => {
          const command = [...args, "WAIT", waitMs];
          if (queue !== undefined) command.push("QUEUE", queue);
          return command;
        },
        deadline,
        signal,
        (answer) => {
          if (!(answer instanceof Error)) late(answer);
        },
        // Closed with its reply unread: a grant may have been lost with the
        // connection. Nothing is given back (never more than was taken).
        () => {},
      );
    } catch (error) {
      throw failed(error);
    }
    if (reply === TIMED_OUT || reply === null || reply === undefined) {
      return this.unanswered(burst);
    }
    const answer = decisionOf(reply);
    if (answer.allowed && (signal?.aborted || performance.now() > deadline)) {
      return refuse(answer.burst);
    }
    return answer;
  }
}
