// How warden's commands reach the server, for ioredis and node-redis alike.
//
// The application's client is only a template: warden opens connections of its
// own from it (ioredis `duplicate()`, node-redis `duplicate()` of a client, of
// a pooled client or of a cluster node's client), so that
//
// - a command is never retried or re-sent after a reconnect (a re-sent acquire
//   can turn a grant nobody read into a second hold);
// - no client-side command timeout cuts a `WAIT` (node-redis 6 has one by
//   default, ioredis' `commandTimeout` abandons a waiter the server grants);
// - integers come back as exact decimal strings (fencing tokens);
// - a waiting request holds a connection of its own, never the application's.

import { ConnectionError, ReplyError } from "./errors.js";
import { keySlot } from "./slot.js";

/** A command's arguments. */
export type Args = readonly (string | number)[];

/** One connection warden opened, to one server. */
export interface Connection {
  /** The node it is connected to (`""` for a standalone server). */
  readonly node: string;
  /** Its `CLIENT ID`, to unblock its request or tell when the server has
   * seen it go: `""` until learned (asked with a waiter's first blocking
   * request, in the same write; never on a command connection). */
  clientId: string;
  /** Sends one command; integers in the reply are decimal strings. `now`:
   * written at once, never held to share a write with the other commands of
   * this turn (a release: the next grant waits for it). */
  send(args: Args, now?: boolean): Promise<unknown>;
  /** Closes it at once: the server drops a request still waiting on it. */
  destroy(): void;
  readonly broken: boolean;
}

/** Where a client's keys live, and how to open connections there. */
export interface Transport {
  /** The node serving `key` (`""` without a cluster). */
  nodeOf(key: string): Promise<string>;
  /** A new connection to `node`, no retries, no command timeout. `shared`:
   * it carries many callers' commands at once (see `Connection`). */
  open(node: string, shared?: boolean): Promise<Connection>;
  /** A cluster redirect (`MOVED`, `ASK`) answered for `key`: learn the slots again. */
  refresh(key: string): Promise<void>;
  /** One server, node `""` (no cluster): its connection can open before the first command. */
  readonly single?: boolean;
}

/** The clients this package takes: ioredis `Redis` or `Cluster`, node-redis
 * `createClient()`, `createClientPool()` or `createCluster()`. */
// biome-ignore lint/suspicious/noExplicitAny: the two libraries' many generic client types
export type Client = any;

function fail(error: unknown): never {
  if (error instanceof ReplyError || error instanceof ConnectionError) throw error;
  const e = error as { name?: string; message?: string };
  const message = e?.message ?? String(error);
  // ioredis: ReplyError; node-redis: ErrorReply (and its subclasses).
  if (e?.name === "ReplyError" || e?.name === "ErrorReply" || isReplyText(message)) {
    // The first command of a server without the module: say what to check.
    if (/^ERR unknown command '(LOCK|RWLOCK|SEM|CACHE|RATE|BF)\./i.test(message)) {
      throw new ReplyError(`${message} (is the warden module loaded? MODULE LIST shows it)`);
    }
    throw new ReplyError(message);
  }
  throw new ConnectionError(message);
}

function isReplyText(message: string): boolean {
  return /^(ERR|WRONGTYPE|READONLY|OOM|MOVED|ASK|NOSCRIPT|NOPERM|UNBLOCKED|CLUSTERDOWN|TRYAGAIN|LOADING|BUSY|NOAUTH) /.test(
    message,
  );
}

/** The fields of an `*.INFO` reply (a flat array under RESP2, a map under
 * RESP3) as numbers by name; null for a nil reply (no such key). */
export function replyFields(reply: unknown): Map<string, number> | null {
  if (reply === null || reply === undefined) return null;
  const fields = new Map<string, number>();
  if (Array.isArray(reply)) {
    for (let i = 0; i + 1 < reply.length; i += 2) {
      fields.set(String(reply[i]), Number(reply[i + 1]));
    }
  } else {
    const entries = reply instanceof Map ? reply.entries() : Object.entries(reply as object);
    for (const [name, value] of entries) fields.set(String(name), Number(value));
  }
  return fields;
}

export function isRedirect(error: unknown): boolean {
  return error instanceof ReplyError && /^(MOVED|ASK) /.test(error.message);
}

// --- ioredis ---------------------------------------------------------------

const IOREDIS_OWN = {
  maxRetriesPerRequest: 0, // a request in flight when the connection drops fails...
  autoResendUnfulfilledCommands: false, // ...and is never sent again
  enableAutoPipelining: false,
  commandTimeout: undefined, // the wait bounds itself: see `Waiters`
  stringNumbers: true, // exact tokens
  lazyConnect: true,
  retryStrategy: () => null, // a broken connection is dropped, never reconnected
  reconnectOnError: () => false,
  enableReadyCheck: false,
};

class IoredisConnection implements Connection {
  broken = false;
  clientId = "";
  private corked = false;
  constructor(
    readonly node: string,
    private readonly redis: Client,
    private readonly shared: boolean,
  ) {}

  static async open(template: Client, node: string, shared = false): Promise<IoredisConnection> {
    const redis = template.duplicate(IOREDIS_OWN);
    redis.on("error", () => {}); // failures reach the command that was on it
    try {
      await redis.connect();
      const conn = new IoredisConnection(node, redis, shared);
      redis.on("close", () => {
        conn.broken = true;
      });
      return conn;
    } catch (error) {
      redis.disconnect();
      fail(error);
    }
  }

  send(args: Args, now = false): Promise<unknown> {
    if (this.shared && !this.corked && !now) {
      // The commands many callers send in one turn of the event loop (a
      // burst of tries) leave in one write: a write is most of a command's
      // cost here. Sent by the end of this turn.
      const stream = this.redis.stream;
      if (stream !== undefined && stream !== null) {
        this.corked = true;
        stream.cork();
        process.nextTick(() => {
          this.corked = false;
          stream.uncork();
        });
      }
    }
    // One array of strings (ioredis flattens it): no spread, no second copy.
    const rest: string[] = new Array(args.length - 1);
    for (let i = 1; i < args.length; i++) rest[i - 1] = String(args[i]);
    return this.redis.call(String(args[0]), rest).catch((error: unknown) => {
      if (!(error as { name?: string })?.name?.includes("ReplyError")) this.broken = true;
      fail(error);
    });
  }

  destroy(): void {
    this.broken = true;
    this.redis.disconnect();
  }
}

function ioredisStandalone(redis: Client): Transport {
  return {
    nodeOf: async () => "",
    open: (node, shared) => IoredisConnection.open(redis, node, shared),
    refresh: async () => {},
    single: true,
  };
}

function ioredisCluster(cluster: Client): Transport {
  const ready = (): Promise<void> =>
    cluster.status === "ready"
      ? Promise.resolve()
      : new Promise((resolve, reject) => {
          cluster.once("ready", resolve);
          cluster.once("end", () => reject(new ConnectionError("the cluster client is closed")));
          if (cluster.status === "wait") cluster.connect().catch(reject);
        });
  return {
    async nodeOf(key) {
      await ready();
      const node = cluster.slots[keySlot(key)]?.[0];
      if (node === undefined) throw new ConnectionError(`no node serves the slot of ${key}`);
      return String(node);
    },
    async open(node, shared) {
      const template = cluster.connectionPool.getInstanceByKey(node);
      if (template === undefined) throw new ConnectionError(`unknown cluster node ${node}`);
      return IoredisConnection.open(template, node, shared);
    },
    refresh: () =>
      new Promise<void>((resolve) => {
        cluster.refreshSlotsCache(() => resolve());
      }),
  };
}

// --- node-redis ------------------------------------------------------------

// RESP_TYPES.NUMBER (':'): integers as strings; no per-command timeout.
const NODE_REDIS_COMMAND = { typeMapping: { 58: String }, timeout: undefined };

class NodeRedisConnection implements Connection {
  broken = false;
  clientId = "";
  constructor(
    readonly node: string,
    private readonly client: Client,
  ) {}

  static async open(template: Client, node: string): Promise<NodeRedisConnection> {
    const options = template.options ?? {};
    const client = template.duplicate({
      socket: { ...options.socket, reconnectStrategy: false },
      disableOfflineQueue: true,
      commandOptions: undefined,
    });
    client.on("error", () => {}); // failures reach the command that was on it
    try {
      await client.connect();
      const conn = new NodeRedisConnection(node, client);
      client.on("end", () => {
        conn.broken = true;
      });
      return conn;
    } catch (error) {
      try {
        client.destroy();
      } catch {}
      fail(error);
    }
  }

  send(args: Args): Promise<unknown> {
    return this.client.sendCommand(args.map(String), NODE_REDIS_COMMAND).catch((error: unknown) => {
      const name = (error as { name?: string })?.name ?? "";
      if (!name.includes("ErrorReply")) this.broken = true;
      fail(error);
    });
  }

  destroy(): void {
    this.broken = true;
    try {
      this.client.destroy();
    } catch {}
  }
}

function nodeRedisStandalone(client: Client): Transport {
  return {
    nodeOf: async () => "",
    open: (node) => NodeRedisConnection.open(client, node),
    refresh: async () => {},
    single: true,
  };
}

function nodeRedisPool(pool: Client): Transport {
  return {
    nodeOf: async () => "",
    // A pooled client is the template; it goes back to the pool at once.
    open: async (node) => NodeRedisConnection.open(await pool.execute((c: Client) => c), node),
    refresh: async () => {},
    single: true,
  };
}

function nodeRedisCluster(cluster: Client): Transport {
  return {
    async nodeOf(key) {
      const master = cluster.slots?.[keySlot(key)]?.master;
      if (master === undefined) throw new ConnectionError(`no node serves the slot of ${key}`);
      return `${master.host}:${master.port}`;
    },
    async open(node) {
      const master = cluster.masters.find(
        (m: { host: string; port: number }) => `${m.host}:${m.port}` === node,
      );
      if (master === undefined) throw new ConnectionError(`unknown cluster node ${node}`);
      return NodeRedisConnection.open(await cluster.nodeClient(master), node);
    },
    async refresh(key) {
      // A keyed command through the cluster client: its own MOVED handling
      // rediscovers the slots.
      await cluster.sendCommand(key, true, ["EXISTS", key]).catch(() => {});
    },
  };
}

/** The transport for one application client, whichever library made it. */
export function transportFor(client: Client): Transport {
  if (client === null || typeof client !== "object") {
    throw new TypeError("warden needs an ioredis or node-redis client");
  }
  const ioredis = typeof client.call === "function" && typeof client.status === "string";
  if (ioredis && client.isCluster === true) return ioredisCluster(client);
  if (ioredis && typeof client.duplicate === "function") return ioredisStandalone(client);
  if (typeof client.getSlotMaster === "function" && Array.isArray(client.masters)) {
    return nodeRedisCluster(client);
  }
  if (typeof client.execute === "function" && typeof client.sendCommand === "function") {
    return nodeRedisPool(client);
  }
  if (typeof client.duplicate === "function" && typeof client.sendCommand === "function") {
    return nodeRedisStandalone(client);
  }
  throw new TypeError(
    "warden needs an ioredis Redis or Cluster, or a node-redis client, pool or cluster",
  );
}
