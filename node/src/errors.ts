/** Every error this package throws is a `WardenError`. */
export class WardenError extends Error {
  override name = "WardenError";
}

/** The lock was not granted within `wait` (or at once, with `wait: 0`). */
export class LockBusyError extends WardenError {
  override name = "LockBusyError";
  constructor(readonly key: string) {
    super(`lock ${JSON.stringify(key)} is busy`);
  }
}

/** The lock is no longer held by this owner: its lease ended, or the key was
 * deleted or overwritten. */
export class LockLostError extends WardenError {
  override name = "LockLostError";
  constructor(
    readonly key: string,
    why: string,
  ) {
    super(`lock ${JSON.stringify(key)} lost: ${why}`);
  }
}

/** Every wait for another caller's load timed out (the loader is stuck). */
export class CacheWaitTimeoutError extends WardenError {
  override name = "CacheWaitTimeoutError";
  constructor(readonly key: string) {
    super(`no value for ${JSON.stringify(key)}: every wait for another caller's load timed out`);
  }
}

/** The server answered a command with an error (`ERR ...`, `WRONGTYPE ...`). */
export class ReplyError extends WardenError {
  override name = "ReplyError";
}

/** A semaphore acquire stated another limit than the semaphore's
 * (`ERR semaphore limit is 10, not 20`): nothing was acquired.
 * `Semaphore.setLimit()` changes the limit on purpose. */
export class SemaphoreLimitError extends ReplyError {
  override name = "SemaphoreLimitError";
  constructor(
    message: string,
    /** The semaphore's limit on the server. */
    readonly limit: number,
    /** The limit the acquire stated. */
    readonly requested: number,
  ) {
    super(message);
  }

  /** The server's refusal of another limit as a `SemaphoreLimitError`; any
   * other error as it was. */
  static from(error: unknown): unknown {
    if (!(error instanceof ReplyError)) return error;
    const m = /^ERR semaphore limit is (\d+), not (\d+)/.exec(error.message);
    return m === null ? error : new SemaphoreLimitError(error.message, Number(m[1]), Number(m[2]));
  }
}

/** A limiter's rate: tokens every `period` ms, at most `burst` at once. */
export interface StatedRate {
  count: number;
  period: number;
  burst: number;
}

/** A rate limiter request stated another rate than the limiter's
 * (`ERR limiter rate is 10 per 1000 ms burst 10, not 5 per 1000 ms burst
 * 5`): nothing was taken. `RateLimiter.setRate()` changes the rate on
 * purpose. */
export class RateMismatchError extends ReplyError {
  override name = "RateMismatchError";
  constructor(
    message: string,
    /** The limiter's rate on the server. */
    readonly rate: StatedRate,
    /** The rate the request stated. */
    readonly requested: StatedRate,
  ) {
    super(message);
  }

  /** The server's refusal of another rate as a `RateMismatchError`; any
   * other error as it was. */
  static from(error: unknown): unknown {
    if (!(error instanceof ReplyError)) return error;
    const m =
      /^ERR limiter rate is (\d+) per (\d+) ms burst (\d+), not (\d+) per (\d+) ms burst (\d+)/.exec(
        error.message,
      );
    if (m === null) return error;
    const [count, period, burst, askedCount, askedPeriod, askedBurst] = m.slice(1).map(Number);
    return new RateMismatchError(
      error.message,
      { count: count as number, period: period as number, burst: burst as number },
      { count: askedCount as number, period: askedPeriod as number, burst: askedBurst as number },
    );
  }
}

/** The connection a command was on failed or timed out before its reply. */
export class ConnectionError extends WardenError {
  override name = "ConnectionError";
}

/** The `reason` of an aborted signal, as an error to throw. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}
