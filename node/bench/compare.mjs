// warden-redis against redlock (4.2.0) and redis-semaphore (Mutex) on one
// server, all on ioredis: uncontended acquire+release latency (median of
// alternating rounds); then 20 tasks
// contending for one key: acquisitions/s, p50/p99 wait, and the commands the
// server ran per acquisition (INFO commandstats deltas).
//
//   node bench/compare.mjs [--quick]    (after npm run build; WARDEN_SERVER,
//                                        WARDEN_MODULE as for the tests)

import { cpus, loadavg } from "node:os";
import { Redis } from "ioredis";
import { Mutex } from "redis-semaphore";
import Redlock from "redlock";
import { Server } from "../build/test/servers.js";
import { Warden } from "../dist/esm/index.js";

const quick = process.argv.includes("--quick");
const UNCONTENDED = quick ? 500 : 2000;
const ROUNDS = quick ? 3 : 5;
const TASKS = 20;
const CONTENDED_MS = quick ? 1500 : 5000;
const TTL = 10000;

function percentile(sorted, p) {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

async function commandCalls(admin) {
  const text = await admin.info("commandstats");
  let calls = 0;
  for (const line of text.split("\n")) {
    const m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line);
    if (m && m[1] !== "info") calls += Number(m[2]);
  }
  return calls;
}

/** Each contender: `lock(key)` resolves to a release function. */
function contenders(client) {
  const warden = new Warden(client, { maxWaiters: TASKS });
  const redlock = new Redlock([client], { retryCount: -1, retryDelay: 200, retryJitter: 100 });
  redlock.on("clientError", () => {});
  return [
    {
      name: "warden-redis",
      async lock(key) {
        const lock = await warden.lock(key, { ttl: TTL });
        return () => lock.release();
      },
      close: () => warden.close(),
    },
    {
      name: "redlock 4.2.0 (retryDelay 200 ms)",
      async lock(key) {
        const lock = await redlock.lock(key, TTL);
        return () => lock.unlock();
      },
      close: async () => {},
    },
    {
      name: "redis-semaphore Mutex (retryInterval 10 ms)",
      async lock(key) {
        const mutex = new Mutex(client, key, {
          lockTimeout: TTL,
          acquireTimeout: 60000,
          retryInterval: 10,
          refreshInterval: 0,
        });
        await mutex.acquire();
        return () => mutex.release();
      },
      close: async () => {},
    },
  ];
}

/** Uncontended acquire+release, in rounds that alternate between the locks
 * (a busy machine drifts): the median of the rounds' means, p99 of all. */
async function uncontended(all, admin) {
  const out = new Map(all.map((c) => [c, { means: [], times: [], calls: 0 }]));
  for (const c of all) for (let i = 0; i < 500; i++) await (await c.lock("warm"))();
  for (let round = 0; round < ROUNDS; round++) {
    for (const c of all) {
      const o = out.get(c);
      const before = await commandCalls(admin);
      const t = [];
      for (let i = 0; i < UNCONTENDED; i++) {
        const t0 = performance.now();
        await (await c.lock(`solo:${c.name}`))();
        t.push(performance.now() - t0);
      }
      o.calls += (await commandCalls(admin)) - before;
      o.means.push(t.reduce((a, b) => a + b, 0) / t.length);
      o.times.push(...t);
    }
  }
  return new Map(
    [...out].map(([c, o]) => {
      o.means.sort((a, b) => a - b);
      o.times.sort((a, b) => a - b);
      return [
        c,
        {
          mean: percentile(o.means, 50),
          p99: percentile(o.times, 99),
          calls: o.calls / (ROUNDS * UNCONTENDED),
        },
      ];
    }),
  );
}

async function contended(c, admin) {
  const key = `shared:${c.name}`;
  const waits = [];
  const stop = performance.now() + CONTENDED_MS;
  const before = await commandCalls(admin);
  const started = performance.now();
  const perTask = Array(TASKS).fill(0);
  await Promise.all(
    Array.from({ length: TASKS }, async (_, task) => {
      while (performance.now() < stop) {
        const t0 = performance.now();
        const release = await c.lock(key);
        waits.push(performance.now() - t0);
        perTask[task] += 1;
        await new Promise((resolve) => setImmediate(resolve)); // the critical section
        await release();
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  const calls = (await commandCalls(admin)) - before;
  waits.sort((a, b) => a - b);
  return {
    rate: waits.length / elapsed,
    p50: percentile(waits, 50),
    p99: percentile(waits, 99),
    max: waits[waits.length - 1],
    fewest: Math.min(...perTask),
    most: Math.max(...perTask),
    calls: calls / waits.length,
  };
}

/** How long the server keeps an aborted waiter: abort, then LOCK.INFO until
 * it shows no waiter (the first answer counts if it already shows none). */
async function abortedWaits(client, admin) {
  const warden = new Warden(client);
  const times = [];
  let firstTry = 0;
  const rounds = quick ? 50 : 200;
  try {
    for (let i = 0; i < rounds; i++) {
      const key = `abort:${i}`;
      await admin.call("LOCK.ACQUIRE", key, "holder", TTL);
      const abort = new AbortController();
      const waiting = warden.lock(key, { ttl: TTL, signal: abort.signal }).catch(() => {});
      while (Number((await admin.call("LOCK.INFO", key))[9]) !== 1);
      const t0 = performance.now();
      abort.abort();
      let polls = 0;
      for (;;) {
        polls += 1;
        if (Number((await admin.call("LOCK.INFO", key))[9]) === 0) break;
      }
      times.push(performance.now() - t0);
      if (polls === 1) firstTry += 1;
      await waiting;
      await admin.call("LOCK.RELEASE", key, "holder");
    }
  } finally {
    await warden.close();
  }
  times.sort((a, b) => a - b);
  return { rounds, p50: percentile(times, 50), p99: percentile(times, 99), firstTry };
}

const server = await Server.start();
const admin = server.admin();
const client = new Redis({ path: server.socket });
const rows = [];
const version = /(?:redis|valkey)_version:(\S+)/.exec(await admin.info("server"))?.[1];
try {
  const all = contenders(client);
  const solos = await uncontended(all, admin);
  for (const c of all) {
    const busy = await contended(c, admin);
    await c.close();
    rows.push({ name: c.name, solo: solos.get(c), busy });
  }
  rows.abort = await abortedWaits(client, admin);
} finally {
  client.disconnect();
  admin.disconnect();
  await server.stop();
}

const ms = (x) => x.toFixed(3);
console.log("# warden-redis, redlock and redis-semaphore (node/bench/compare.mjs)\n");
console.log(
  `One ${process.env.WARDEN_SERVER ?? "redis-server"} ${version} with the module on a unix socket, ioredis 5, Node ${process.version}, ${cpus().length} cores (load average ${loadavg()[0].toFixed(1)} after the run); ${TASKS} contending tasks for ${CONTENDED_MS / 1000} s. Commands: INFO commandstats calls, the ones scripts run included.\n`,
);
console.log(
  "| lock | uncontended acquire+release mean / p99 (ms) | commands per uncontended acquisition | contended acquisitions/s | contended wait p50 / p99 / max (ms) | acquisitions per task, fewest / most | commands per contended acquisition |",
);
console.log("|---|---|---|---|---|---|---|");
for (const { name, solo, busy } of rows) {
  console.log(
    `| ${name} | ${ms(solo.mean)} / ${ms(solo.p99)} | ${solo.calls.toFixed(1)} | ${busy.rate.toFixed(0)} | ${ms(busy.p50)} / ${ms(busy.p99)} / ${ms(busy.max)} | ${busy.fewest} / ${busy.most} | ${busy.calls.toFixed(1)} |`,
  );
}
const a = rows.abort;
console.log(
  `\nAn aborted warden wait: gone from the server's queue after ${ms(a.p50)} ms (p50), ${ms(a.p99)} ms (p99); the first LOCK.INFO after the abort already showed it gone in ${a.firstTry} of ${a.rounds} rounds.`,
);
