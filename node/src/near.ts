// The near cache: values kept in this process, dropped when the server says
// so. One connection of its own (RESP3, CLIENT TRACKING on) carries its
// CACHE.PEEK reads and the server's invalidation pushes in one ordered
// stream; a read keeps its reply only if no invalidation of its key and no
// flush came between sending it and reading the reply (its generation).

import * as net from "node:net";
import * as tls from "node:tls";
import { ConnectionError, ReplyError } from "./errors.js";
import { Parser, Push, encode } from "./resp3.js";
import type { Args, Client } from "./transport.js";

export interface NearCacheOptions {
  /** Values kept at most (default 10000); the least recently used go first. */
  maxEntries?: number;
  /** Bytes of values (UTF-8) kept at most (default 64 MiB). */
  maxBytes?: number;
}

/** What the near cache did since it started. */
export interface NearCacheStats {
  /** Reads answered from this process, with no round trip. */
  hits: number;
  /** Reads that went to the server. */
  misses: number;
  /** Keys the server told it to drop. */
  invalidations: number;
  /** Times it dropped everything: its connection dropped, or a FLUSHALL/FLUSHDB. */
  flushes: number;
}

/** Where the tracking connection goes, and how it logs in. */
export interface Endpoint {
  host?: string;
  port?: number;
  path?: string;
  tls?: tls.ConnectionOptions;
  username?: string;
  password?: string;
  db?: number;
}

interface Entry {
  value: string;
  bytes: number;
  /** Unix ms, by this process' clock; -1: none. */
  expiresAt: number;
}

/** The generation of one key's reads in flight. */
interface Reading {
  generation: number;
  readers: number;
}

const CONNECT_TIMEOUT = 5000;
const MAX_BACKOFF = 1000;

/** The tracking connection: commands in, replies and pushes out, in order. */
class Tracking {
  private readonly parser = new Parser();
  private readonly waiting: { resolve(v: unknown): void; reject(e: unknown): void }[] = [];
  private gone = false;
  /** `CLIENT ID` of the connection (learned in the handshake). */
  id = "";

  private constructor(
    private readonly socket: net.Socket,
    private readonly onPush: (push: Push) => void,
    onClose: () => void,
  ) {
    socket.setNoDelay(true);
    socket.on("data", (chunk: Buffer) => {
      let frames: unknown[];
      try {
        frames = this.parser.feed(chunk);
      } catch {
        socket.destroy();
        return;
      }
      for (const frame of frames) {
        if (frame instanceof Push) {
          this.onPush(frame);
          continue;
        }
        const waiter = this.waiting.shift();
        if (waiter === undefined) continue;
        if (frame instanceof ReplyError) waiter.reject(frame);
        else waiter.resolve(frame);
      }
    });
    socket.on("error", () => socket.destroy());
    socket.on("close", () => {
      this.gone = true;
      for (const waiter of this.waiting.splice(0)) {
        waiter.reject(new ConnectionError("the near cache's connection closed"));
      }
      onClose();
    });
  }

  static async open(
    endpoint: Endpoint,
    onPush: (push: Push) => void,
    onClose: () => void,
  ): Promise<Tracking> {
    const socket = await connect(endpoint);
    const conn = new Tracking(socket, onPush, onClose);
    try {
      const hello: (string | number)[] = ["HELLO", 3];
      if (endpoint.password !== undefined) {
        hello.push("AUTH", endpoint.username ?? "default", endpoint.password);
      }
      const steps: Promise<unknown>[] = [conn.send(hello)];
      if (endpoint.db) steps.push(conn.send(["SELECT", endpoint.db]));
      steps.push(conn.send(["CLIENT", "TRACKING", "on"]));
      steps.push(conn.send(["CLIENT", "ID"]));
      steps.push(conn.send(["ROLE"]));
      const replies = await Promise.all(steps);
      conn.id = String(replies[replies.length - 2]);
      // A demoted master (a failover Sentinel has not told us of yet) is no
      // place to read: its writes come from elsewhere.
      const role = replies[replies.length - 1] as unknown[];
      if (role[0] !== "master") throw new ConnectionError(`the server is a ${String(role[0])}`);
      return conn;
    } catch (error) {
      socket.destroy();
      throw error;
    }
  }

  get closed(): boolean {
    return this.gone;
  }

  send(args: Args): Promise<unknown> {
    if (this.gone) return Promise.reject(new ConnectionError("the near cache's connection closed"));
    return new Promise((resolve, reject) => {
      this.waiting.push({ resolve, reject });
      this.socket.write(encode(args));
    });
  }

  destroy(): void {
    this.socket.destroy();
  }
}

function connect(endpoint: Endpoint): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    let socket: net.Socket;
    if (endpoint.path !== undefined) socket = net.connect(endpoint.path);
    else if (endpoint.tls !== undefined) {
      socket = tls.connect({ ...endpoint.tls, host: endpoint.host, port: endpoint.port });
    } else socket = net.connect(endpoint.port ?? 6379, endpoint.host ?? "127.0.0.1");
    const event =
      endpoint.tls !== undefined && endpoint.path === undefined ? "secureConnect" : "connect";
    const timer = setTimeout(
      () => socket.destroy(new ConnectionError("connect timed out")),
      CONNECT_TIMEOUT,
    );
    socket.once(event, () => {
      clearTimeout(timer);
      socket.off("error", failed);
      resolve(socket);
    });
    const failed = (error: Error) => {
      clearTimeout(timer);
      socket.destroy();
      reject(new ConnectionError(error.message));
    };
    socket.once("error", failed);
  });
}

/** How to find the server of an application client, each time the near
 * cache connects (with Sentinel: the master the client's library finds). */
export function endpointOf(client: Client): () => Promise<Endpoint> {
  const ioredis = typeof client?.call === "function" && typeof client?.status === "string";
  if (client?.isCluster === true || typeof client?.getSlotMaster === "function") {
    throw new TypeError("the near cache takes a single server or Sentinel, not a cluster");
  }
  if (ioredis) {
    const o = client.options ?? {};
    const base: Endpoint = {
      host: o.host,
      port: o.port,
      path: o.path ?? undefined,
      tls: o.tls ?? undefined,
      username: o.username ?? undefined,
      password: o.password ?? undefined,
      db: o.db,
    };
    if (!Array.isArray(o.sentinels) || o.sentinels.length === 0) return async () => base;
    // Sentinel: the client's library asks the sentinels for the master (and
    // checks its role); the near cache connects where it landed.
    return async () => {
      const probe = client.duplicate({
        lazyConnect: true,
        retryStrategy: () => null,
        sentinelRetryStrategy: () => null,
        maxRetriesPerRequest: 0,
        enableOfflineQueue: false,
      });
      probe.on("error", () => {});
      try {
        await probe.connect();
        const stream = probe.stream as net.Socket;
        return { ...base, host: stream.remoteAddress, port: stream.remotePort, path: undefined };
      } catch (error) {
        throw new ConnectionError(String((error as Error)?.message ?? error));
      } finally {
        probe.disconnect();
      }
    };
  }
  const optionsOf = async (): Promise<Record<string, unknown>> =>
    typeof client?.execute === "function" && client?.options === undefined
      ? client.execute((c: Client) => c.options ?? {})
      : (client?.options ?? {});
  return async () => {
    const o = (await optionsOf()) as {
      socket?: Record<string, unknown>;
      username?: string;
      password?: string;
      database?: number;
    };
    const socket = o.socket ?? {};
    const { host, port, path, tls: secure, ...rest } = socket;
    return {
      host: host as string | undefined,
      port: port as number | undefined,
      path: path as string | undefined,
      tls: secure === true ? (rest as tls.ConnectionOptions) : undefined,
      username: o.username,
      password: o.password,
      db: o.database,
    };
  };
}

/** Values of one cache kept in this process until the server invalidates
 * them (see "Near cache" in docs/clients/node.md). */
export class NearCache {
  private readonly entries = new Map<string, Entry>();
  private readonly reading = new Map<string, Reading>();
  private readonly maxEntries: number;
  private readonly maxBytes: number;
  private bytes = 0;
  /** Moved on by every flush: a read that saw another epoch keeps nothing. */
  private epoch = 0;
  private conn: Tracking | undefined;
  private opening: Promise<void> | undefined;
  private retry: NodeJS.Timeout | undefined;
  private backoff = 0;
  private closed = false;
  private readonly counts: NearCacheStats = { hits: 0, misses: 0, invalidations: 0, flushes: 0 };

  /** @internal */
  constructor(
    private readonly endpoint: () => Promise<Endpoint>,
    options: NearCacheOptions = {},
  ) {
    this.maxEntries = options.maxEntries ?? 10000;
    this.maxBytes = options.maxBytes ?? 64 * 1024 * 1024;
    if (!(this.maxEntries >= 0) || !(this.maxBytes >= 0)) {
      throw new RangeError("maxEntries and maxBytes must be 0 or more");
    }
    this.open();
  }

  /** The counters, as of now. */
  stats(): NearCacheStats {
    return { ...this.counts };
  }

  /** Values held now. */
  get size(): number {
    return this.entries.size;
  }

  /** The `CLIENT ID` of the tracking connection (`""` while it is down). */
  get clientId(): string {
    return this.conn?.id ?? "";
  }

  /** True while the tracking connection is up (reads may be served here). */
  get connected(): boolean {
    return this.conn !== undefined;
  }

  /** Resolves once the tracking connection is up (for tests and warm-up). */
  async ready(): Promise<void> {
    while (this.conn === undefined && !this.closed) {
      await (this.opening ?? new Promise((resolve) => setTimeout(resolve, 5)));
    }
  }

  /** The value held for `key`, or undefined (a miss: ask the server). With
   * `refresh`, a value that ends within `refresh` ms is a miss, so that the
   * server's refresh ahead sees the read. @internal */
  get(key: string, refresh?: number): string | undefined {
    const entry = this.entries.get(key);
    if (entry !== undefined) {
      const left = entry.expiresAt === -1 ? Number.POSITIVE_INFINITY : entry.expiresAt - Date.now();
      if (left <= 0) this.remove(key, entry);
      else if (refresh === undefined || left >= refresh) {
        // Most recently used: last in the map's order.
        this.entries.delete(key);
        this.entries.set(key, entry);
        this.counts.hits++;
        return entry.value;
      }
    }
    this.counts.misses++;
    return undefined;
  }

  /** `CACHE.PEEK key` on the tracking connection: the value when the server
   * holds a fresh one (kept here if nothing invalidated it meanwhile), else
   * undefined (nil, stale, near refresh, or the connection is down): read
   * through `CACHE.GET`. @internal */
  async peek(key: string, refresh?: number): Promise<string | undefined> {
    const conn = this.conn;
    // A key with a lone surrogate is sent as U+FFFD (UTF-8 has no other way):
    // its invalidation would name another string. Never kept: the server
    // answers it.
    if (conn === undefined || !wellFormed(key)) return undefined;
    let reading = this.reading.get(key);
    if (reading === undefined) {
      reading = { generation: 0, readers: 0 };
      this.reading.set(key, reading);
    }
    reading.readers++;
    const generation = reading.generation;
    const epoch = this.epoch;
    let reply: unknown;
    try {
      reply = await conn.send(["CACHE.PEEK", key]);
    } catch {
      return undefined;
    } finally {
      if (--reading.readers === 0) this.reading.delete(key);
    }
    if (!Array.isArray(reply)) return undefined;
    const [value, expiresAt, stale] = reply as [string, number, number];
    if (stale !== 0 || typeof value !== "string") return undefined;
    const left = expiresAt === -1 ? Number.POSITIVE_INFINITY : expiresAt - Date.now();
    if (refresh !== undefined && left < refresh) return undefined;
    if (generation === reading.generation && epoch === this.epoch && left > 0) {
      this.keep(key, value, expiresAt);
    }
    return value;
  }

  /** One round trip on the tracking connection: every invalidation the
   * server queued before it has been applied when it resolves. */
  async sync(): Promise<void> {
    const conn = this.conn;
    if (conn === undefined) return; // down: nothing is held, reads go to the server
    try {
      await conn.send(["PING"]);
    } catch {
      // The connection dropped: everything was flushed.
    }
  }

  /** Drops `key` here at once (the cache's own `invalidate`). */
  drop(key: string): void {
    const entry = this.entries.get(key);
    if (entry !== undefined) this.remove(key, entry);
    const reading = this.reading.get(key);
    if (reading !== undefined) reading.generation++;
  }

  /** Drops everything held. */
  flush(): void {
    this.entries.clear();
    this.bytes = 0;
    this.epoch++;
    this.counts.flushes++;
  }

  /** Closes the tracking connection; nothing is held after. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.retry !== undefined) clearTimeout(this.retry);
    this.retry = undefined;
    await this.opening?.catch(() => {});
    this.conn?.destroy();
    this.conn = undefined;
    this.entries.clear();
    this.bytes = 0;
    this.epoch++;
  }

  private keep(key: string, value: string, expiresAt: number): void {
    const old = this.entries.get(key);
    if (old !== undefined) this.remove(key, old);
    const bytes = Buffer.byteLength(value);
    if (bytes > this.maxBytes || this.maxEntries === 0) return;
    while (this.entries.size >= this.maxEntries || this.bytes + bytes > this.maxBytes) {
      const [oldest, entry] = this.entries.entries().next().value as [string, Entry];
      this.remove(oldest, entry);
    }
    this.entries.set(key, { value, bytes, expiresAt });
    this.bytes += bytes;
  }

  private remove(key: string, entry: Entry): void {
    this.entries.delete(key);
    this.bytes -= entry.bytes;
  }

  private invalidated(push: Push): void {
    const [kind, keys] = push.items;
    if (kind !== "invalidate") return;
    if (!Array.isArray(keys)) {
      this.flush(); // FLUSHALL / FLUSHDB
      return;
    }
    for (const key of keys) {
      this.counts.invalidations++;
      this.drop(String(key));
    }
  }

  private open(): void {
    if (this.closed || this.opening !== undefined) return;
    let conn: Tracking | undefined;
    this.opening = this.endpoint()
      .then((endpoint) =>
        Tracking.open(
          endpoint,
          (push) => {
            if (conn !== undefined && this.conn === conn) this.invalidated(push);
          },
          () => this.dropped(conn),
        ),
      )
      .then(
        (opened) => {
          conn = opened;
          this.opening = undefined;
          if (this.closed || opened.closed) {
            opened.destroy();
            if (!this.closed) this.later();
            return;
          }
          this.backoff = 0;
          // Whatever was held came before this connection's tracking began.
          this.entries.clear();
          this.bytes = 0;
          this.epoch++;
          this.conn = opened;
        },
        () => {
          this.opening = undefined;
          this.later();
        },
      );
  }

  private dropped(conn: Tracking | undefined): void {
    if (conn === undefined || this.conn !== conn) return;
    this.conn = undefined;
    this.flush();
    this.later();
  }

  private later(): void {
    if (this.closed || this.retry !== undefined) return;
    this.backoff = Math.min(MAX_BACKOFF, Math.max(10, this.backoff * 2));
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.open();
    }, this.backoff);
    this.retry.unref();
  }
}

/** Whether `key` is well-formed UTF-16 (no lone surrogate), so that UTF-8
 * and back give the same string. */
function wellFormed(key: string): boolean {
  const check = (key as { isWellFormed?: () => boolean }).isWellFormed;
  return check !== undefined ? check.call(key) : Buffer.from(key, "utf8").toString("utf8") === key;
}
