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

/** The connection a command was on failed or timed out before its reply. */
export class ConnectionError extends WardenError {
  override name = "ConnectionError";
}

/** The `reason` of an aborted signal, as an error to throw. */
export function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}
