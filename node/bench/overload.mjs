// Overload and fast path: warden-redis against npm redis-semaphore (polling),
// both on ioredis (warden also on node-redis), one JSON object per row.
//
// - scenario: a semaphore of limit 3, each holder 4 ms inside, one request a
//   ms for 300 ms, each caller giving up after 50 ms (capacity bound ~263):
//   granted, granted after the caller's deadline (late), most inside at once,
//   errors, p50/p99 acquire latency of the grants. warden with `wait: 50`,
//   with `signal: AbortSignal.timeout(50)` alone, and with both.
// - burst: 32 acquires at once with free permits (limit 32), on a fresh
//   client: time to the first grant and to all 32.
// - throughput: 50 callers on a limit of 5, one INCR inside, for a fixed
//   time: acquisitions/s and p50/p99 acquire latency.
//
//   node bench/overload.mjs [--quick] [--rounds N]  (after npm run build and
//   tsc -p tsconfig.test.json; WARDEN_SERVER, WARDEN_MODULE as for the tests;
//   WARDEN_CLIENT=path/to/index.js measures another build of the package)

import { Redis } from "ioredis";
import { createClient } from "redis";
import { Semaphore as PollingSemaphore } from "redis-semaphore";
import { Server } from "../build/test/servers.js";

const { Warden: Base } = await import(process.env.WARDEN_CLIENT ?? "../dist/esm/index.js");
// WARDEN_OPTIONS: a JSON object of Warden options (default: none, the defaults).
const OPTIONS = JSON.parse(process.env.WARDEN_OPTIONS ?? "{}");
class Warden extends Base {
  constructor(client) {
    super(client, OPTIONS);
  }
}

const quick = process.argv.includes("--quick");
const roundsArg = process.argv.indexOf("--rounds");
const ROUNDS = roundsArg > 0 ? Number(process.argv[roundsArg + 1]) : quick ? 1 : 3;
const DEADLINE = 50;
const HOLD = 4;
const LIMIT = 3;
const REQUESTS = 300;
const BURST = 32;
const CALLERS = 50;
const CALLERS_LIMIT = 5;
const THROUGHPUT_MS = quick ? 1000 : 3000;
const TTL = 10000;

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}
const round3 = (x) => (x === null ? null : Math.round(x * 1000) / 1000);

/** A timeout of the caller's own: not granted, not an error. */
function isTimeout(error) {
  const name = error?.name ?? "";
  if (name === "LockBusyError" || name === "TimeoutError" || name === "AbortError") return true;
  // redis-semaphore's TimeoutError keeps the name "Error".
  return error?.constructor?.name === "TimeoutError";
}

/** warden: `acquire()` resolves to a release function or null. */
function wardenSemaphore(warden, key, limit, how) {
  const sem = warden.semaphore(key, limit);
  return async () => {
    const options = { ttl: TTL };
    if (how.wait !== undefined) options.wait = how.wait;
    if (how.signal) options.signal = AbortSignal.timeout(DEADLINE);
    const permit = await sem.acquire(options);
    return () => permit.release();
  };
}

function pollingSemaphore(client, key, limit, acquireTimeout) {
  return async () => {
    const s = new PollingSemaphore(client, key, limit, {
      acquireTimeout,
      lockTimeout: TTL,
      refreshInterval: 0,
    });
    await s.acquire();
    return () => s.release();
  };
}

/** One request a ms for REQUESTS ms, each giving up after DEADLINE ms. */
async function scenario(acquire) {
  const out = { granted: 0, late: 0, max_inside: 0, errors: 0, timeouts: 0 };
  const latencies = [];
  let inside = 0;
  const calls = [];
  const caller = async () => {
    const t0 = performance.now();
    let release;
    try {
      release = await acquire();
    } catch (error) {
      if (isTimeout(error)) out.timeouts++;
      else {
        out.errors++;
        out.error ??= String(error?.message ?? error);
      }
      return;
    }
    const took = performance.now() - t0;
    out.granted++;
    if (took > DEADLINE) out.late++;
    latencies.push(took);
    inside++;
    out.max_inside = Math.max(out.max_inside, inside);
    await sleep(HOLD);
    inside--;
    await release().catch(() => {});
  };
  const start = performance.now();
  let launched = 0;
  while (launched < REQUESTS) {
    const due = Math.min(REQUESTS, Math.floor(performance.now() - start) + 1);
    while (launched < due) {
      calls.push(caller());
      launched++;
    }
    await sleep(1);
  }
  await Promise.all(calls);
  latencies.sort((a, b) => a - b);
  out.p50_ms = round3(percentile(latencies, 50));
  out.p99_ms = round3(percentile(latencies, 99));
  return out;
}

/** BURST acquires at once with free permits. */
async function burst(acquire) {
  const t0 = performance.now();
  let first = null;
  const releases = await Promise.all(
    Array.from({ length: BURST }, async () => {
      const release = await acquire();
      first ??= performance.now() - t0;
      return release;
    }),
  );
  const all = performance.now() - t0;
  await Promise.all(releases.map((r) => r()));
  return { first_ms: round3(first), all_ms: round3(all) };
}

/** CALLERS loops on a limit of CALLERS_LIMIT, one INCR inside. */
async function throughput(acquire, client, key) {
  const latencies = [];
  let errors = 0;
  const stop = performance.now() + THROUGHPUT_MS;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: CALLERS }, async () => {
      while (performance.now() < stop) {
        const t0 = performance.now();
        let release;
        try {
          release = await acquire();
        } catch {
          errors++;
          continue;
        }
        latencies.push(performance.now() - t0);
        await client.incr(`${key}:counter`);
        await release();
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  latencies.sort((a, b) => a - b);
  return {
    per_s: Math.round(latencies.length / elapsed),
    p50_ms: round3(percentile(latencies, 50)),
    p99_ms: round3(percentile(latencies, 99)),
    errors,
  };
}

const server = await Server.start();
const admin = server.admin();
const version = /(?:redis|valkey)_version:(\S+)/.exec(await admin.info("server"))?.[1];
const base = {
  server: `${(process.env.WARDEN_SERVER ?? "redis-server").split("/").pop()} ${version}`,
  client_build: process.env.WARDEN_CLIENT ?? "this checkout",
  options: OPTIONS,
};
const print = (row) => console.log(JSON.stringify({ section: "overload", ...base, ...row }));

const libraries = [
  {
    name: "ioredis",
    open: async () => {
      const r = new Redis({ path: server.socket });
      r.on("error", () => {});
      return { client: r, incr: (k) => r.incr(k), close: async () => r.disconnect() };
    },
  },
  {
    name: "node-redis",
    open: async () => {
      const c = createClient({ socket: { path: server.socket } });
      c.on("error", () => {});
      await c.connect();
      return { client: c, incr: (k) => c.incr(k), close: async () => c.destroy() };
    },
  },
];

const HOW = [
  { deadline: "wait: 50", wait: DEADLINE },
  { deadline: "signal: AbortSignal.timeout(50)", signal: true },
  { deadline: "wait: 50 + signal", wait: DEADLINE, signal: true },
];

let n = 0;
try {
  for (let round = 0; round < ROUNDS; round++) {
    for (const lib of libraries) {
      const app = await lib.open();
      for (const how of HOW) {
        const warden = new Warden(app.client);
        const key = `scenario:${n++}`;
        const row = await scenario(wardenSemaphore(warden, key, LIMIT, how));
        await warden.close();
        print({
          row: "scenario",
          round,
          lock: `warden-redis (${lib.name})`,
          deadline: how.deadline,
          ...row,
        });
      }
      if (lib.name === "ioredis") {
        const key = `scenario:${n++}`;
        const row = await scenario(pollingSemaphore(app.client, key, LIMIT, DEADLINE));
        print({
          row: "scenario",
          round,
          lock: "redis-semaphore 5.8 (ioredis)",
          deadline: "acquireTimeout: 50",
          ...row,
        });
      }
      await app.close();
    }
    for (const lib of libraries) {
      const app = await lib.open();
      const warden = new Warden(app.client); // fresh: no connection open yet
      const row = await burst(wardenSemaphore(warden, `burst:${n++}`, BURST, { wait: 1000 }));
      await warden.close();
      print({ row: "burst", round, lock: `warden-redis (${lib.name})`, acquires: BURST, ...row });
      if (lib.name === "ioredis") {
        const poll = await burst(pollingSemaphore(app.client, `burst:${n++}`, BURST, 1000));
        print({
          row: "burst",
          round,
          lock: "redis-semaphore 5.8 (ioredis)",
          acquires: BURST,
          ...poll,
        });
      }
      await app.close();
    }
    for (const lib of libraries) {
      const app = await lib.open();
      const warden = new Warden(app.client);
      const key = `busy:${n++}`;
      const row = await throughput(wardenSemaphore(warden, key, CALLERS_LIMIT, {}), app, key);
      await warden.close();
      print({
        row: "throughput",
        round,
        lock: `warden-redis (${lib.name})`,
        callers: CALLERS,
        limit: CALLERS_LIMIT,
        ...row,
      });
      if (lib.name === "ioredis") {
        const pkey = `busy:${n++}`;
        const poll = await throughput(
          pollingSemaphore(app.client, pkey, CALLERS_LIMIT, 60000),
          app,
          pkey,
        );
        print({
          row: "throughput",
          round,
          lock: "redis-semaphore 5.8 (ioredis)",
          callers: CALLERS,
          limit: CALLERS_LIMIT,
          ...poll,
        });
      }
      await app.close();
    }
  }
} finally {
  admin.disconnect();
  await server.stop();
}
