// warden's own connections for one application client: one multiplexed
// connection per node for the commands that never block (release, extend,
// info, fill), and a bounded set of waiter connections, each carrying one
// blocking request at a time. A full waiter set queues further waits here, in
// the process; releases never wait for a waiter connection.

import { ConnectionError, ReplyError, abortReason } from "./errors.js";
import { type Args, type Connection, type Transport, isRedirect } from "./transport.js";

export interface ConnectionOptions {
  /** Waiter connections at most (per client; default 32). */
  maxWaiters: number;
  /** Idle waiter connections kept open for the next wait (default 8). */
  maxIdleWaiters: number;
  /** How much longer than its `WAIT` a blocking request waits for its reply
   * before its connection is closed (ms; default 5000). */
  readMargin: number;
}

interface Queued {
  node: string;
  resolve(conn: Connection): void;
  reject(error: unknown): void;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export class Connections {
  private readonly commands = new Map<string, Promise<Connection>>();
  private readonly idle = new Map<string, Connection[]>();
  private readonly queue: Queued[] = [];
  private readonly busy = new Set<Connection>();
  private waiters = 0;
  private closed = false;

  constructor(
    private readonly transport: Transport,
    readonly options: ConnectionOptions,
  ) {}

  /** One command that never blocks, about `key`, sent once. A cluster
   * redirect (the command did not run) refreshes the slots and sends it again. */
  async run(key: string, args: Args): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const node = await this.transport.nodeOf(key);
      const conn = await this.command(node);
      try {
        return await conn.send(args);
      } catch (error) {
        if (attempt > 0 || !isRedirect(error)) throw error;
        await this.transport.refresh(key);
      }
    }
  }

  private command(node: string): Promise<Connection> {
    if (this.closed) return Promise.reject(new ConnectionError("warden is closed"));
    let conn = this.commands.get(node);
    if (conn === undefined) {
      conn = this.transport.open(node);
      this.commands.set(node, conn);
      conn.catch(() => this.commands.delete(node));
      return conn;
    }
    return conn.then((c) => {
      if (!c.broken) return c;
      if (this.commands.get(node) === conn) this.commands.delete(node);
      return this.command(node);
    });
  }

  /** One blocking request that waits `waitMs` in the server (`Infinity`:
   * forever) on a waiter connection. When the signal aborts, or no reply comes
   * within `waitMs` + `readMargin`, the connection is closed — the server drops
   * the request — and `abandoned` is told the connection's client id. */
  async wait(
    key: string,
    args: Args,
    waitMs: number,
    signal: AbortSignal | undefined,
    abandoned: (clientId: string) => void,
  ): Promise<unknown> {
    for (let attempt = 0; ; attempt++) {
      const conn = await this.take(await this.transport.nodeOf(key), signal);
      try {
        return await this.waitOn(conn, args, waitMs, signal, abandoned);
      } catch (error) {
        if (attempt > 0 || !isRedirect(error)) throw error;
        await this.transport.refresh(key);
      }
    }
  }

  /** The node serving `key`. */
  nodeOf(key: string): Promise<string> {
    return this.transport.nodeOf(key);
  }

  /** A blocking request on a held connection (see `wait`). */
  waitOn(
    conn: Connection,
    args: Args,
    waitMs: number,
    signal: AbortSignal | undefined,
    abandoned?: (clientId: string) => void,
    release = true,
  ): Promise<unknown> {
    return new Promise((resolve, reject) => {
      let done = false;
      let timer: NodeJS.Timeout | undefined;
      const settle = () => {
        done = true;
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      };
      const abandon = (error: unknown) => {
        if (done) return;
        settle();
        conn.destroy();
        if (release) this.give(conn);
        abandoned?.(conn.clientId);
        reject(error);
      };
      const onAbort = () => abandon(abortReason(signal as AbortSignal));
      if (signal?.aborted) {
        done = true;
        if (release) this.give(conn);
        reject(abortReason(signal));
        return;
      }
      if (Number.isFinite(waitMs)) {
        const limit = waitMs + this.options.readMargin;
        timer = setTimeout(
          () => abandon(new ConnectionError(`no reply to ${args[0]} within ${limit} ms`)),
          limit,
        );
      }
      signal?.addEventListener("abort", onAbort, { once: true });
      conn.send(args).then(
        (reply) => {
          if (done) return;
          settle();
          if (release) this.give(conn);
          resolve(reply);
        },
        (error: unknown) => {
          if (done) return;
          settle();
          if (!(error instanceof ReplyError)) {
            conn.destroy();
            abandoned?.(conn.clientId);
          }
          if (release) this.give(conn);
          reject(error);
        },
      );
    });
  }

  /** Resolves once the server no longer lists the client `clientId` of
   * `key`'s node (a closed connection takes the server a moment to notice). */
  async gone(key: string, clientId: string): Promise<void> {
    for (let i = 0; i < 200; i++) {
      let listed: unknown;
      try {
        listed = await this.run(key, ["CLIENT", "LIST", "ID", clientId]);
      } catch {
        await sleep(50); // CLIENT LIST not allowed: give the server time
        return;
      }
      if (listed === "" || listed === null || String(listed).trim() === "") return;
      await sleep(Math.min(1 + i, 20));
    }
  }

  /** A waiter connection to `node`, for `waitOn` requests; `give` it back. */
  async take(node: string, signal: AbortSignal | undefined): Promise<Connection> {
    const conn = await this.checkOut(node, signal);
    this.busy.add(conn);
    return conn;
  }

  private checkOut(node: string, signal: AbortSignal | undefined): Promise<Connection> {
    if (this.closed) return Promise.reject(new ConnectionError("warden is closed"));
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    const idle = this.idle.get(node);
    while (idle !== undefined && idle.length > 0) {
      const conn = idle.pop() as Connection;
      if (!conn.broken) return Promise.resolve(conn);
      this.waiters--;
    }
    if (this.waiters < this.options.maxWaiters) return this.openWaiter(node);
    return new Promise((resolve, reject) => {
      const entry: Queued = {
        node,
        resolve: (conn) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(conn);
        },
        reject: (error) => {
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
      };
      const onAbort = () => {
        const i = this.queue.indexOf(entry);
        if (i >= 0) this.queue.splice(i, 1);
        reject(abortReason(signal as AbortSignal));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.queue.push(entry);
    });
  }

  private openWaiter(node: string): Promise<Connection> {
    this.waiters++;
    return this.transport.open(node).catch((error: unknown) => {
      this.waiters--;
      this.wakeOne();
      throw error;
    });
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
        next.resolve(conn);
        return;
      }
      conn.destroy();
      this.waiters--;
      this.openWaiter(next.node).then((c) => {
        this.busy.add(c);
        next.resolve(c);
      }, next.reject);
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
    if (next !== undefined) {
      this.openWaiter(next.node).then((c) => {
        this.busy.add(c);
        next.resolve(c);
      }, next.reject);
    }
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
    const commands = [...this.commands.values()];
    this.commands.clear();
    for (const conn of await Promise.allSettled(commands)) {
      if (conn.status === "fulfilled") conn.value.destroy();
    }
  }
}
