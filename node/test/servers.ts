// Real servers with the module loaded, for the tests and the benchmark.
// WARDEN_SERVER names the server binary (default redis-server), WARDEN_MODULE
// the module (default: the release build of this checkout).

import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Redis } from "ioredis";
import { createClient, createClientPool } from "redis";
import { createClient as createClient6 } from "redis6";

// Compiled into node/build/test: the checkout is three levels up.
const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
export const SERVER = process.env.WARDEN_SERVER ?? "redis-server";
export const MODULE = process.env.WARDEN_MODULE ?? join(ROOT, "target/release/libwarden.so");

export const sleep = (ms: number): Promise<void> =>
  new Promise((resolve) => setTimeout(resolve, ms));

/** Polls `check` until it is truthy; fails after `ms`. */
export async function until<T>(check: () => Promise<T> | T, what: string, ms = 5000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

export class Server {
  readonly dir: string;
  readonly socket: string;
  readonly log: string;
  process: ChildProcess;
  private readonly args: string[];

  constructor(extra: string[] = [], port = 0) {
    this.dir = mkdtempSync(join(tmpdir(), "warden-node-"));
    this.socket = join(this.dir, "redis.sock");
    this.log = join(this.dir, "server.log");
    const args = ["--port", String(port), "--unixsocket", this.socket, "--dir", this.dir];
    args.push("--save", "");
    if (port) args.push("--bind", "127.0.0.1");
    // A replica's first sync starts at once (the default waits 5 s for more).
    args.push("--repl-diskless-sync-delay", "0");
    args.push("--appendonly", "no", "--logfile", this.log, "--loadmodule", MODULE, ...extra);
    this.args = args;
    this.process = spawn(SERVER, args, { stdio: "ignore" });
  }

  static async start(extra: string[] = [], port = 0): Promise<Server> {
    const server = new Server(extra, port);
    await server.started();
    return server;
  }

  /** Stops the server (SIGTERM: it writes its AOF) and starts it again on
   * the same socket, port and directory; every connection to it closes. */
  async restart(): Promise<void> {
    const exited = new Promise((resolve) => this.process.once("exit", resolve));
    this.process.kill("SIGTERM");
    if (this.process.exitCode === null && this.process.signalCode === null) await exited;
    this.process = spawn(SERVER, this.args, { stdio: "ignore" });
    await this.started();
  }

  private async started(): Promise<void> {
    const probe = new Redis({ path: this.socket, lazyConnect: true, retryStrategy: () => null });
    probe.on("error", () => {});
    try {
      await until(
        async () => {
          if (this.process.exitCode !== null) {
            throw new Error(`${SERVER} did not start:\n${this.logText()}`);
          }
          try {
            if (probe.status !== "ready") await probe.connect();
            return (await probe.ping()) === "PONG";
          } catch {
            probe.disconnect();
            return false;
          }
        },
        `${SERVER} to start`,
        10000,
      );
    } finally {
      probe.disconnect();
    }
  }

  logText(): string {
    try {
      return readFileSync(this.log, "utf8");
    } catch {
      return "";
    }
  }

  /** A plain ioredis connection for the test's own checks. */
  admin(): Redis {
    const r = new Redis({ path: this.socket });
    r.on("error", () => {});
    return r;
  }

  async stop(): Promise<void> {
    const exited = new Promise((resolve) => this.process.once("exit", resolve));
    this.process.kill("SIGKILL");
    if (this.process.exitCode === null && this.process.signalCode === null) await exited;
    rmSync(this.dir, { recursive: true, force: true });
  }
}

export interface AppClient {
  // biome-ignore lint/suspicious/noExplicitAny: either library's client
  client: any;
  close(): Promise<void>;
}

/** The application clients the package is tested with. */
export const CLIENTS: { name: string; open(server: Server): Promise<AppClient> }[] = [
  {
    name: "ioredis",
    async open(server: Server) {
      const r = new Redis({ path: server.socket });
      r.on("error", () => {});
      return { client: r, close: async () => r.disconnect() };
    },
  },
  {
    name: "node-redis",
    async open(server: Server) {
      const c = createClient({ socket: { path: server.socket, tls: false } });
      c.on("error", () => {});
      await c.connect();
      return { client: c, close: async () => c.destroy() };
    },
  },
  {
    name: "node-redis RESP3",
    async open(server: Server) {
      const c = createClient({ socket: { path: server.socket, tls: false }, RESP: 3 });
      c.on("error", () => {});
      await c.connect();
      return { client: c, close: async () => c.destroy() };
    },
  },
  {
    name: "node-redis 6",
    async open(server: Server) {
      const c = createClient6({ socket: { path: server.socket, tls: false } });
      c.on("error", () => {});
      await c.connect();
      return { client: c, close: async () => c.destroy() };
    },
  },
  {
    name: "node-redis pool",
    async open(server: Server) {
      const p = createClientPool({ socket: { path: server.socket, tls: false } }, { maximum: 2 });
      p.on("error", () => {});
      await p.connect();
      return { client: p, close: async () => p.destroy() };
    },
  },
];

/** LOCK.INFO (or RWLOCK.INFO) as an object, or null. */
export async function info(
  admin: Redis,
  key: string,
  command = "LOCK.INFO",
  // biome-ignore lint/suspicious/noExplicitAny: the fields of an INFO reply (or null)
): Promise<any> {
  const reply = (await admin.call(command, key)) as unknown[] | null;
  if (reply === null) return null;
  const out: Record<string, unknown> = {};
  for (let i = 0; i < reply.length; i += 2) out[String(reply[i])] = reply[i + 1];
  return out;
}
