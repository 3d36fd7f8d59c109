// warden's own connections for one application client: one multiplexed
// connection per node for the commands that never block (tries, release,
// extend, info, fill), and a bounded set of waiter connections, each carrying
// one blocking request at a time. A full waiter set queues further waits here,
// in the process, each only until its caller's deadline; releases never wait
// for a waiter connection.

import { ConnectionError, ReplyError, abortReason } from "./errors.js";
import { type Args, type Connection, type Transport, isRedirect } from "./transport.js";

export interface ConnectionOptions {
  /** Waiter connections at most (per client; default 128). */
  maxWaiters: number;
  /** Idle waiter connections kept open for the next wait (default 16). */
  maxIdleWaiters: number;
  /** How much longer than its `WAIT` a blocking request waits for its reply
   * before its connection is closed (ms; default 5000). */
  readMargin: number;
}

interface Queued {
  node: string;
  /** False: the caller left (deadline, abort); the connection is not taken. */
  resolve(conn: Connection): boolean;
  reject(error: unknown): void;
}

/** What cancels nothing: shared, not made per call. */
const NOOP = (): void => {};

export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, ms));

/** What `wait` answers when the caller's deadline passed first. */
export const TIMED_OUT: unique symbol = Symbol("timed out");

/** The longest delay a Node timer keeps (a longer one fires at once). */
const MAX_TIMER = 2 ** 31 - 1;
/** How long an abort on a server without `CLIENT UNBLOCK` of module waiters
 * waits for the server to drop the closed waiter before answering (ms). */
const GONE_MS = 1000;
/** The longest `WAIT` the server takes. */
const MAX_WAIT = 2 ** 46;

/** Callers listening to one signal: one listener on the signal fans out to
 * them, however many acquires share it (no MaxListenersExceededWarning). */
const listeners = new WeakMap<AbortSignal, Set<() => void>>();

/** Runs `fn` when `signal` aborts; returns what stops listening. */
export function onAbort(signal: AbortSignal | undefined, fn: () => void): () => void {
  if (signal === undefined) return NOOP;
  let set = listeners.get(signal);
  if (set === undefined) {
    const callers = new Set<() => void>();
    set = callers;
    listeners.set(signal, callers);
    signal.addEventListener(
      "abort",
      () => {
        listeners.delete(signal);
        for (const f of [...callers]) f();
      },
      { once: true },
    );
  }
  const mine = set;
  mine.add(fn);
  return () => mine.delete(fn);
}

/** Runs `fn` once `ms` ms have passed (never for `Infinity`); delays past
 * Node's timer limit are chained. Returns what cancels it. */
export function later(ms: number, fn: () => void, unref = false): () => void {
  if (!(ms < Number.POSITIVE_INFINITY)) return NOOP;
  const end = performance.now() + ms;
  let handle: NodeJS.Timeout;
  const arm = () => {
    const left = end - performance.now();
    handle = left > MAX_TIMER ? setTimeout(arm, MAX_TIMER) : setTimeout(fn, Math.max(0, left));
    if (unref) handle.unref();
  };
  arm();
  return () => clearTimeout(handle);
}

/** `work`'s value, or `TIMED_OUT` once `deadline` (a `performance.now()`
 * time) passes first; rejects with the signal's reason on abort. What
 * `work` yields after the caller left goes to `leftValue` / `leftError`:
 * the caller is answered by its deadline whatever the server does. */
export function within<T>(
  work: Promise<T>,
  deadline: number,
  signal: AbortSignal | undefined,
  leftValue: (value: T) => void,
  leftError: (error: unknown) => void = () => {},
): Promise<T | typeof TIMED_OUT> {
  return new Promise((resolve, reject) => {
    let left = false;
    let cancel = () => {};
    let unlisten = () => {};
    const leave = () => {
      left = true;
      cancel();
      unlisten();
    };
    const aborted = () => {
      if (left) return;
      leave();
      reject(abortReason(signal as AbortSignal));
    };
    work.then(
      (value) => {
        if (left) return leftValue(value);
        leave();
        resolve(value);
      },
      (error: unknown) => {
        if (left) return leftError(error);
        leave();
        reject(error);
      },
    );
    if (signal?.aborted) return aborted();
    cancel = later(Math.max(0, deadline - performance.now()), () => {
      if (left) return;
      leave();
      resolve(TIMED_OUT);
    });
    unlisten = onAbort(signal, aborted);
  });
}

/** The `WAIT` to send now for `deadline` (a `performance.now()` time): the
 * time that remains less a margin for the reply's trip (a tenth of it, 1 to
 * 5 ms), at least 1; 0 (forever) without a deadline; null when nothing
 * remains (send nothing: the caller has timed out). */
export function serverWait(deadline: number): number | null {
  if (deadline === Number.POSITIVE_INFINITY) return 0;
  const remaining = deadline - performance.now();
  if (remaining < 1) return null;
  const margin = Math.min(5, Math.max(1, remaining / 10));
  return Math.min(MAX_WAIT, Math.max(1, Math.floor(remaining - margin)));
}

/** The requests `WARDEN.WITHDRAW key owner` takes out of a queue: those with
 * an owner, which is their second argument, after the key. */
const WITHDRAWABLE = new Set(["LOCK.ACQUIRE", "RWLOCK.READ", "RWLOCK.WRITE", "SEM.ACQUIRE"]);

/** Whether a server's error refuses the command itself there: an ACL
 * (`NOPERM`), or a server without it (a module before 1.1.0, a renamed
 * command). Not a passing state (`BUSY`, `LOADING`, a redirect): the command
 * is sent again next time. */
function refusesCommand(error: Error): boolean {
  return error.message.startsWith("NOPERM") || /unknown command/i.test(error.message);
}

/** Whether a server's `INFO server` names one whose `CLIENT UNBLOCK` takes a
 * module's waiter out of its queue (Redis >= 7.4, Valkey >= 8). */
export function unblocksModuleWaiters(info: string): boolean {
  const version = (name: string): [number, number] | null => {
    const m = new RegExp(`^${name}_version:(\\d+)\\.(\\d+)`, "m").exec(info);
    return m === null ? null : [Number(m[1]), Number(m[2])];
  };
  const valkey = version("valkey");
  if (valkey !== null) return valkey[0] >= 8;
  const redis = version("redis");
  return redis !== null && (redis[0] > 7 || (redis[0] === 7 && redis[1] >= 4));
}

export class Connections {
  private readonly commands = new Map<string, Promise<Connection>>();
  private readonly idle = new Map<string, Connection[]>();
  private readonly queue: Queued[] = [];
  private readonly busy = new Set<Connection>();
  private readonly unblocks = new Map<string, Promise<boolean>>();
  /** Nodes that refuse `CLIENT` to this user (ACL, rename-command): their
   * waiters are never unblocked, an abort closes the connection. */
  private readonly noClient = new Set<string>();
  /** Nodes that refuse `WARDEN.WITHDRAW` (a module before 1.1.0, an ACL). */
  private readonly noWithdraw = new Set<string>();
  /** Requests of this process waiting, by command, then key (no key
   * string built per request). */
  private readonly waiting = new Map<string, Map<string, number>>();
  private waiters = 0;
  /** A single server's command connection, once open (`run`'s fast path). */
  private single: Connection | undefined;
  private closed = false;
  private shut = false;
  private readonly behind = new Set<Promise<unknown>>();
  /** Blocking requests whose replies are unread (`close` waits for them:
   * a grant among them is given back). */
  private readonly pending = new Set<Promise<unknown>>();
  /** Commands `run` was asked for: `close` waits until none came since its
   * last look (a release sent during close is answered, not cut off). */
  private runs = 0;

  constructor(
    private readonly transport: Transport,
    readonly options: ConnectionOptions,
  ) {}

  /** One command that never blocks, about `key`, sent once. A cluster
   * redirect (the command did not run) refreshes the slots and sends it again.
   * `now`: written at once (see `Connection.send`). */
  run(key: string, args: Args, now = false): Promise<unknown> {
    this.runs++;
    // A single server's open connection: sent now, no turn of the event loop
    // spent finding it (a release is on the path of the next grant).
    const ready = this.single;
    if (ready !== undefined && !ready.broken && !this.shut) {
      try {
        return ready.send(args, now);
      } catch (error) {
        return Promise.reject(error);
      }
    }
    return this.routed(key, args, now);
  }

  private async routed(key: string, args: Args, now: boolean): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const node = await this.transport.nodeOf(key);
      const conn = await this.command(node);
      try {
        return await conn.send(args, now);
      } catch (error) {
        if (attempt > 0 || !isRedirect(error)) throw error;
        await this.transport.refresh(key);
      }
    }
  }

  /** Opens the command connection of a single server now, so that the first
   * acquire is one round trip, not a connection setup and a round trip. */
  warm(): void {
    if (this.transport.single) this.command("").catch(() => {});
  }

  /** True once `close()` was called: no new acquire starts. */
  get isClosed(): boolean {
    return this.closed;
  }

  /** A give-back's command: on the command connection until `close()` has
   * closed it, then on a connection of its own (a grant found late is never
   * left held until its lease ends). */
  async giveBack(key: string, args: Args): Promise<unknown> {
    if (!this.shut) return this.run(key, args, true);
    const conn = await this.transport.open(await this.transport.nodeOf(key));
    try {
      return await conn.send(args);
    } finally {
      conn.destroy();
    }
  }

  /** Work in the background (giving a grant back) that `close` waits for. */
  background(work: Promise<unknown>): void {
    const settled = work.catch(() => {}).finally(() => this.behind.delete(settled));
    this.behind.add(settled);
  }

  private command(node: string): Promise<Connection> {
    if (this.shut) return Promise.reject(new ConnectionError("warden is closed"));
    let conn = this.commands.get(node);
    if (conn === undefined) {
      conn = this.transport.open(node, true);
      this.commands.set(node, conn);
      const opened = conn;
      opened.then(
        (c) => {
          if (this.transport.single && this.commands.get(node) === opened) this.single = c;
        },
        () => this.commands.delete(node),
      );
      return conn;
    }
    return conn.then((c) => {
      if (!c.broken) return c;
      if (this.commands.get(node) === conn) this.commands.delete(node);
      return this.command(node);
    });
  }

  /** One blocking request about `key` on a waiter connection, within
   * `deadline` (a `performance.now()` time; `Infinity`: none). `build` makes
   * the command for the `WAIT` it carries (0: forever), computed when it is
   * sent. Resolves to the reply, or `TIMED_OUT` when the deadline passes
   * first (also while waiting for a waiter connection); rejects with the
   * signal's reason on abort. A reply read after the call settled goes to
   * `late` (a grant nobody takes); a connection closed with its reply unread
   * goes to `abandoned`. */
  async wait(
    key: string,
    build: (waitMs: number) => Args,
    deadline: number,
    signal: AbortSignal | undefined,
    late: (reply: unknown) => void,
    abandoned: (clientId: string) => void,
  ): Promise<unknown> {
    // Built once: the command it is counted under, and the one sent
    // without a deadline.
    const forever = build(0);
    const command = String(forever[0]);
    let queued = this.waiting.get(command);
    if (queued === undefined) {
      queued = new Map();
      this.waiting.set(command, queued);
    }
    queued.set(key, (queued.get(key) ?? 0) + 1);
    try {
      for (let attempt = 0; ; attempt++) {
        // A single server's idle waiter connection is taken without a turn
        // of the event loop (the common case of a busy key).
        const node = this.transport.single ? "" : await this.transport.nodeOf(key);
        const conn = this.takeIdle(node, signal) ?? (await this.take(node, signal, deadline));
        if (conn === null) return TIMED_OUT;
        const waitMs = serverWait(deadline);
        if (waitMs === null) {
          this.give(conn);
          return TIMED_OUT;
        }
        try {
          const reply = await this.waitOn(
            conn,
            waitMs === 0 ? forever : build(waitMs),
            waitMs,
            deadline,
            signal,
            late,
            abandoned,
          );
          if (reply !== TIMED_OUT) this.give(conn);
          return reply;
        } catch (error) {
          if (attempt > 0 || !isRedirect(error)) throw error;
          await this.transport.refresh(key);
        }
      }
    } finally {
      const n = (queued.get(key) ?? 1) - 1;
      if (n > 0) queued.set(key, n);
      else queued.delete(key);
    }
  }

  /** Whether a request of this process waits with `command` on `key`: the
   * server's FIFO queue is not empty, so a try would be answered nil. */
  queued(command: string, key: string): boolean {
    return this.waiting.get(command)?.has(key) === true;
  }

  /** The node serving `key`. */
  nodeOf(key: string): Promise<string> {
    return this.transport.nodeOf(key);
  }

  /** A blocking request with `WAIT waitMs` on a held waiter connection (see
   * `wait`). Resolved with the reply, the connection is the caller's again;
   * in every other case (an error, `TIMED_OUT`, an abort) `waitOn` gives it
   * back itself, once its reply is read or it is closed. */
  waitOn(
    conn: Connection,
    args: Args,
    waitMs: number,
    deadline: number,
    signal: AbortSignal | undefined,
    late: (reply: unknown) => void,
    abandoned: (clientId: string) => void,
  ): Promise<unknown> {
    return new Promise((resolve, reject) => {
      let settled = false;
      let replied = false;
      let cancelDeadline = NOOP;
      let cancelRead = NOOP;
      let unlisten = NOOP;
      // The connection's id, to unblock this request on abort: asked with it
      // (below) while unknown.
      let asked: Promise<string> | undefined;
      const id = (): Promise<string> => asked ?? Promise.resolve(conn.clientId);
      const settle = () => {
        settled = true;
        cancelDeadline();
        unlisten();
      };
      const finished = () => {
        replied = true;
        cancelRead();
      };
      // The reply will never be read: close the connection, so the server
      // drops the request (and any grant made to it ends with it).
      const drop = () => {
        if (replied) return;
        finished();
        conn.destroy();
        this.give(conn);
        abandoned(conn.clientId);
      };
      if (signal?.aborted) {
        this.give(conn);
        reject(abortReason(signal));
        return;
      }
      // The caller is answered at its deadline even if the reply is late;
      // the server's WAIT ends before it, so the reply follows shortly.
      if (deadline < Number.POSITIVE_INFINITY) {
        cancelDeadline = later(Math.max(0, deadline - performance.now()), () => {
          if (settled) return;
          settle();
          resolve(TIMED_OUT);
        });
      }
      if (waitMs > 0) {
        // No reply long after the server's WAIT: the connection is lost.
        cancelRead = later(waitMs + this.options.readMargin, () => {
          if (!settled) {
            settle();
            reject(
              new ConnectionError(
                `no reply to ${args[0]} within ${waitMs + this.options.readMargin} ms`,
              ),
            );
          }
          drop();
        });
      }
      if (signal !== undefined) {
        const aborted = async () => {
          if (settled) return;
          settle();
          const reason = abortReason(signal as AbortSignal);
          if (!replied && (await this.withdraw(conn.node, args))) {
            // Taken out of the queue: the waiter is answered nil on its own
            // connection, which is kept (the reply goes to `late`, then the
            // connection back to the pool). Answered after WITHDRAW's reply, so
            // the abort is ordered before the caller's next command.
            reject(reason);
            return;
          }
          const unblockable = await this.unblockable(conn.node);
          if (replied) {
            // Read while WITHDRAW (or the INFO that tells whether UNBLOCK works)
            // was on its way: a grant, given back by `late`. The connection may
            // already carry another caller's wait, which an UNBLOCK or a close
            // would cut off. Nothing is left to do.
            reject(reason);
            return;
          }
          if (unblockable) {
            // Answered once the server has taken the waiter out (UNBLOCK's
            // reply), so the abort is ordered before the caller's next command
            // on any connection.
            if (!(await this.unblock(conn, id(), Number.isFinite(waitMs) && waitMs > 0))) drop();
            reject(reason);
            return;
          }
          // Redis 7.0-7.2: closing the connection is the only way out, and the
          // server may read that close after the caller's next command (another
          // connection). The abort is answered once the server no longer lists
          // the waiter (bounded), so it is ordered before whatever comes next;
          // where CLIENT is refused, at once.
          let cancel = () => {};
          const clientId = await Promise.race([
            id(),
            new Promise<string>((resolve) => {
              cancel = later(GONE_MS, () => resolve(""), true);
            }),
          ]);
          cancel();
          // A reply read meanwhile keeps the connection (a grant goes to `late`).
          if (!replied) {
            drop();
            await this.gone(conn.node, clientId, GONE_MS);
          }
          reject(reason);
        };
        unlisten = onAbort(signal, aborted);
      }
      if (conn.clientId === "" && !this.noClient.has(conn.node)) {
        // The id (to unblock this request on abort) in the same write as the
        // request: no round trip before waiting. A server that refuses
        // CLIENT still lets it wait; an abort then closes the connection.
        asked = conn.send(["CLIENT", "ID"]).then(
          (reply) => {
            conn.clientId = String(reply);
            return conn.clientId;
          },
          (error: unknown) => {
            if (error instanceof ReplyError) this.noClient.add(conn.node);
            return "";
          },
        );
      }
      const sent = conn.send(args);
      this.pending.add(sent);
      sent.then(
        (reply) => {
          this.pending.delete(sent);
          if (replied) return;
          finished();
          if (!settled) {
            settle();
            resolve(reply);
            return;
          }
          late(reply);
          this.give(conn);
        },
        (error: unknown) => {
          this.pending.delete(sent);
          if (replied) return;
          finished();
          const broken = !(error instanceof ReplyError);
          if (broken) {
            conn.destroy();
            abandoned(conn.clientId);
          }
          this.give(conn);
          if (!settled) {
            settle();
            reject(error);
          }
        },
      );
    });
  }

  /** Takes the waiter on `conn` out of the server's queue with `CLIENT
   * UNBLOCK`, where the server answers it with nil and the connection stays
   * usable (Redis >= 7.4, Valkey >= 8). False: close the connection instead
   * (an older server, or UNBLOCK found nothing blocked and the request may
   * wait forever). */
  private async unblock(conn: Connection, id: Promise<string>, bounded: boolean): Promise<boolean> {
    try {
      const clientId = await id;
      if (clientId === "" || !(await this.unblockable(conn.node))) return false;
      const n = Number(await (await this.command(conn.node)).send(["CLIENT", "UNBLOCK", clientId]));
      // 0: the reply is on its way, or the request has not reached the
      // server yet; a bounded WAIT answers it in time anyway.
      return n === 1 || bounded;
    } catch {
      return false;
    }
  }

  /** `WARDEN.WITHDRAW key owner` for a request with an owner (key and owner
   * are its first two arguments): true when the server took it out of its
   * queue. False when it was not queued (granted, its reply on its way, or
   * not arrived yet), or the node has no such command (a module before
   * 1.1.0, an ACL): the caller then unblocks or closes the connection. */
  private async withdraw(node: string, args: Args): Promise<boolean> {
    const [command, key, owner] = args;
    if (key === undefined || owner === undefined) return false;
    if (!WITHDRAWABLE.has(String(command)) || this.noWithdraw.has(node)) return false;
    try {
      const n = await (await this.command(node)).send(["WARDEN.WITHDRAW", key, owner]);
      return Number(n) > 0;
    } catch (error) {
      if (error instanceof ReplyError && refusesCommand(error)) this.noWithdraw.add(node);
      return false;
    }
  }

  /** Whether `node` unblocks a warden waiter with `CLIENT UNBLOCK`, learned
   * once from `INFO server`. */
  private unblockable(node: string): Promise<boolean> {
    let known = this.unblocks.get(node);
    if (known === undefined) {
      known = this.command(node)
        .then((c) => c.send(["INFO", "server"]))
        .then((info) => unblocksModuleWaiters(String(info)))
        .catch(() => {
          this.unblocks.delete(node);
          return false;
        });
      this.unblocks.set(node, known);
    }
    return known;
  }

  /** Resolves true once the server `node` no longer lists the client
   * `clientId` (a closed connection takes the server a moment to notice);
   * false when that is not known within `ms` (no id, `CLIENT` refused, still
   * listed). */
  async gone(node: string, clientId: string, ms: number): Promise<boolean> {
    if (clientId === "") return false;
    const end = performance.now() + ms;
    for (let i = 0; ; i++) {
      let listed: unknown;
      try {
        listed = await (await this.command(node)).send(["CLIENT", "LIST", "ID", clientId]);
      } catch {
        return false;
      }
      if (listed === "" || listed === null || String(listed).trim() === "") return true;
      const pause = Math.min(1 + i, 20, end - performance.now());
      if (pause <= 0) return false;
      await sleep(pause);
    }
  }

  /** An idle waiter connection to `node`, taken as `take` would, or null
   * when none is idle (or `take` would refuse: closed, aborted). */
  private takeIdle(node: string, signal: AbortSignal | undefined): Connection | null {
    if (this.closed || signal?.aborted) return null;
    const idle = this.idle.get(node);
    while (idle !== undefined && idle.length > 0) {
      const conn = idle.pop() as Connection;
      if (!conn.broken) {
        this.busy.add(conn);
        return conn;
      }
      this.waiters--;
    }
    return null;
  }

  /** A waiter connection to `node`, for `waitOn` requests; `give` it back.
   * Null when `deadline` passes before one is free: a request never waits
   * here past its caller's deadline. */
  async take(
    node: string,
    signal: AbortSignal | undefined,
    deadline = Number.POSITIVE_INFINITY,
  ): Promise<Connection | null> {
    this.unblockable(node); // learned before the first abort needs it
    const conn = await this.checkOut(node, signal, deadline);
    if (conn !== null) this.busy.add(conn);
    if (conn !== null && this.closed) {
      // close() came while the caller was being answered: never used.
      this.give(conn);
      throw new ConnectionError("warden is closed");
    }
    return conn;
  }

  private checkOut(
    node: string,
    signal: AbortSignal | undefined,
    deadline: number,
  ): Promise<Connection | null> {
    if (this.closed) return Promise.reject(new ConnectionError("warden is closed"));
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const idle = this.idle.get(node);
    while (idle !== undefined && idle.length > 0) {
      const conn = idle.pop() as Connection;
      if (!conn.broken) return Promise.resolve(conn);
      this.waiters--;
    }
    if (performance.now() >= deadline) return Promise.resolve(null);
    if (this.waiters < this.options.maxWaiters) {
      // Opening is raced against the deadline too; a connection that opens
      // after its caller left goes to the next one (or the idle set).
      return within(this.openWaiter(node), deadline, signal, (conn) => {
        this.busy.add(conn);
        this.give(conn);
      }).then((conn) => (conn === TIMED_OUT ? null : conn));
    }
    return new Promise((resolve, reject) => {
      let cancel = () => {};
      let unlisten = () => {};
      const leave = () => {
        left = true;
        cancel();
        unlisten();
        const i = this.queue.indexOf(entry);
        if (i >= 0) this.queue.splice(i, 1);
      };
      let left = false;
      const entry: Queued = {
        node,
        resolve: (conn) => {
          if (left) return false;
          leave();
          resolve(conn);
          return true;
        },
        reject: (error) => {
          leave();
          reject(error);
        },
      };
      cancel = later(Math.max(0, deadline - performance.now()), () => {
        leave();
        resolve(null);
      });
      unlisten = onAbort(signal, () => {
        leave();
        reject(abortReason(signal as AbortSignal));
      });
      this.queue.push(entry);
    });
  }

  private openWaiter(node: string): Promise<Connection> {
    this.waiters++;
    return this.transport.open(node).then(
      (conn) => {
        if (!this.closed) return conn;
        // Opened after close(): closed at once, never used.
        conn.destroy();
        this.waiters--;
        throw new ConnectionError("warden is closed");
      },
      (error: unknown) => {
        this.waiters--;
        this.wakeOne();
        throw error;
      },
    );
  }

  /** A waiter connection is free again (or closed). */
  give(conn: Connection): void {
    if (!this.busy.delete(conn)) return; // given back already
    if (this.closed || conn.broken) {
      if (!conn.broken) conn.destroy();
      this.waiters--;
      this.wakeOne();
      return;
    }
    const next = this.queue.shift();
    if (next !== undefined) {
      if (next.node === conn.node) {
        this.busy.add(conn);
        if (!next.resolve(conn)) this.give(conn);
        return;
      }
      conn.destroy();
      this.waiters--;
      this.handOver(next);
      return;
    }
    const idle = this.idle.get(conn.node) ?? [];
    if (idle.length >= this.options.maxIdleWaiters) {
      conn.destroy();
      this.waiters--;
      return;
    }
    idle.push(conn);
    this.idle.set(conn.node, idle);
  }

  private wakeOne(): void {
    const next = this.queue.shift();
    if (next !== undefined) this.handOver(next);
  }

  /** A new waiter connection for a queued request (given back if its caller
   * left while it opened). */
  private handOver(next: Queued): void {
    this.openWaiter(next.node).then((c) => {
      this.busy.add(c);
      if (!next.resolve(c)) this.give(c);
    }, next.reject);
  }

  /** Closes warden's connections (not the application's client). */
  async close(): Promise<void> {
    this.closed = true;
    for (const entry of this.queue.splice(0)) {
      entry.reject(new ConnectionError("warden is closed"));
    }
    for (const list of this.idle.values()) for (const conn of list) conn.destroy();
    this.idle.clear();
    for (const conn of this.busy) conn.destroy();
    // Grants on their way back (a late reply, an abort, a closed waiter, a
    // try answered during close) are released before the shared connections
    // close: the closed waiters' requests fail (their give-backs start), the
    // commands already sent are answered (a PING's reply follows theirs),
    // and what that started settles, until nothing new starts.
    for (;;) {
      const runs = this.runs;
      await Promise.allSettled([...this.pending]);
      await Promise.allSettled(
        [...this.commands.values()].map((c) => c.then((conn) => conn.send(["PING"]))),
      );
      await new Promise((resolve) => setImmediate(resolve));
      if (this.behind.size === 0 && this.pending.size === 0 && this.runs === runs) break;
      await Promise.allSettled([...this.behind]);
    }
    this.shut = true;
    this.single = undefined;
    const commands = [...this.commands.values()];
    this.commands.clear();
    for (const conn of await Promise.allSettled(commands)) {
      if (conn.status === "fulfilled") conn.value.destroy();
    }
  }
}
