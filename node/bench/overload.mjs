// The overload bench's driver for warden-redis and npm redis-semaphore, both
// on one ioredis client with the libraries' defaults (bench/overload.py runs
// it; `make bench SECTION=overload`). One run of one scenario against a
// server with the module; prints one JSON object on stdout.
//
// Parameters (`--name value`; times in ms):
//   --port P            the server, 127.0.0.1:P
//   --client C          warden-wait (acquire({ wait: deadline })),
//                       warden-signal (acquire({ signal: AbortSignal.timeout(deadline) })),
//                       warden-shed (acquire({ wait: deadline, maxQueue: 2 * limit }):
//                       load shedding, QUEUE n),
//                       redis-semaphore (Semaphore, or Mutex for --kind lock;
//                       acquireTimeout: deadline)
//   --scenario S        overload, burst or throughput
//   --kind K            sem (a semaphore of --limit) or lock (limit 1)
//   --key KEY
//   overload: --limit --hold-ms --interval-ms --requests --deadline-ms
//     one request every interval; each holds hold-ms once granted. Prints
//     {"granted","late","max_inside","errors","error_sample",
//      "lat_ms":[acquire latency of each grant]}; late = granted after
//     deadline-ms from the call (held like any grant: the caller cannot tell);
//     "span_ms": from the first call to the last (a loaded machine stretches it);
//     "held_ms": each hold, from the grant reaching the caller to the release's reply.
//   burst: --limit --requests --rounds
//     per round a fresh Warden (the ioredis client already connected),
//     `requests` acquires at once with permits free. Prints
//     {"first_ms":[per round],"all_ms":[per round],"errors","error_sample"}.
//   throughput: --limit --callers --seconds
//     each caller loops acquire (no deadline: the libraries' default wait),
//     one INCR inside, release. Prints {"acquisitions","seconds","rate",
//     "lat_ms":[each acquire's wait],"max_inside","errors","error_sample",
//     "client_cpu_us","server_cpu_us"}: CPU per acquisition, in µs, of this
//     process (process.cpuUsage(), user + system) and of the server (INFO
//     cpu, used_cpu_user + used_cpu_sys), over the callers' loops.
//   --version prints the packages' versions (their package.json).

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { Redis } from "ioredis";
import { Mutex, Semaphore, TimeoutError } from "redis-semaphore";
import { LockBusyError, Warden } from "../dist/esm/index.js";

const require = createRequire(import.meta.url);
const TTL = 10000;

function versionOf(pkg) {
  // Some packages do not export package.json: find it beside their entry point.
  let dir = require.resolve(pkg);
  while (dir !== "/") {
    dir = dir.slice(0, dir.lastIndexOf("/"));
    try {
      const meta = JSON.parse(readFileSync(`${dir}/package.json`, "utf8"));
      if (meta.name === pkg) return meta.version;
    } catch {}
  }
  return "?";
}

const args = process.argv.slice(2);
if (args.includes("--version")) {
  const own = JSON.parse(readFileSync(new URL("../package.json", import.meta.url), "utf8"));
  console.log(
    JSON.stringify({
      "warden-redis": own.version,
      "redis-semaphore": versionOf("redis-semaphore"),
      ioredis: versionOf("ioredis"),
      node: process.versions.node,
    }),
  );
  process.exit(0);
}
const p = {};
for (let i = 0; i < args.length; i += 2) p[args[i].replace(/^--/, "")] = args[i + 1];
const num = (name) => Number(p[name]);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** A deadline passing, as each library reports it (not an error): warden's
 * LockBusyError, the AbortSignal's reason, redis-semaphore's TimeoutError. */
function isTimeout(e) {
  return (
    e instanceof LockBusyError ||
    e instanceof TimeoutError ||
    e?.name === "TimeoutError" ||
    e?.name === "AbortError"
  );
}

/** One acquire with `deadline` ms (Infinity: the library's default wait);
 * resolves to a release function, or null if not granted. */
async function acquire(warden, client, deadline) {
  const limit = p.kind === "lock" ? 1 : num("limit");
  try {
    if (p.client === "redis-semaphore") {
      const opts = { lockTimeout: TTL };
      if (deadline !== Number.POSITIVE_INFINITY) opts.acquireTimeout = deadline;
      const s =
        p.kind === "lock"
          ? new Mutex(client, p.key, opts)
          : new Semaphore(client, p.key, limit, opts);
      await s.acquire();
      return () => s.release();
    }
    const opts = { ttl: TTL };
    if (deadline !== Number.POSITIVE_INFINITY) {
      if (p.client === "warden-signal") opts.signal = AbortSignal.timeout(deadline);
      else opts.wait = deadline;
      if (p.client === "warden-shed") opts.maxQueue = 2 * limit;
    }
    const held =
      p.kind === "lock"
        ? await warden.lock(p.key, opts)
        : await warden.semaphore(p.key, limit).acquire(opts);
    return () => held.release();
  } catch (e) {
    if (isTimeout(e)) return null;
    throw e;
  }
}

const out = { errors: 0, error_sample: "" };
function failed(e) {
  out.errors += 1;
  out.error_sample = String(e?.message ?? e).slice(0, 200);
}

async function overload(client) {
  const warden = new Warden(client);
  const deadline = num("deadline-ms");
  let inside = 0;
  let maxInside = 0;
  const lat = [];
  const held = [];
  let late = 0;
  const calls = [];
  const start = performance.now();
  for (let i = 0; i < num("requests"); i++) {
    const due = start + i * num("interval-ms");
    if (due > performance.now()) await sleep(due - performance.now());
    calls.push(
      (async () => {
        const t0 = performance.now();
        const release = await acquire(warden, client, deadline);
        if (release === null) return;
        const waited = performance.now() - t0;
        lat.push(waited);
        if (waited > deadline) late += 1;
        inside += 1;
        maxInside = Math.max(maxInside, inside);
        const granted = performance.now();
        await sleep(num("hold-ms"));
        inside -= 1;
        await release();
        held.push(performance.now() - granted);
      })().catch(failed),
    );
  }
  const span = performance.now() - start;
  await Promise.all(calls);
  await warden.close();
  Object.assign(out, {
    span_ms: span,
    granted: lat.length,
    late,
    max_inside: maxInside,
    lat_ms: lat,
    held_ms: held,
  });
}

async function burst(client) {
  const first = [];
  const all = [];
  for (let round = 0; round < num("rounds"); round++) {
    const warden = new Warden(client);
    const start = performance.now();
    const times = [];
    const releases = await Promise.all(
      Array.from({ length: num("requests") }, async () => {
        try {
          const release = await acquire(warden, client, 5000);
          if (release === null) throw new Error("not granted in 5 s");
          times.push(performance.now() - start);
          return release;
        } catch (e) {
          failed(e);
          return async () => {};
        }
      }),
    );
    for (const release of releases) await release().catch(failed);
    await warden.close();
    if (times.length > 0) {
      first.push(Math.min(...times));
      all.push(Math.max(...times));
    }
  }
  Object.assign(out, { first_ms: first, all_ms: all });
}

/** The server's CPU time so far (INFO cpu: used_cpu_user + used_cpu_sys), in µs. */
async function serverCpu(client) {
  const info = await client.info("cpu");
  const field = (name) =>
    Number(new RegExp(`^${name}:([\\d.]+)`, "m").exec(info)?.[1] ?? Number.NaN);
  return (field("used_cpu_user") + field("used_cpu_sys")) * 1e6;
}

async function throughput(client) {
  const warden = new Warden(client);
  const server0 = await serverCpu(client);
  const cpu0 = process.cpuUsage();
  const stop = performance.now() + num("seconds") * 1000;
  const lat = [];
  let inside = 0;
  let maxInside = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: num("callers") }, async () => {
      while (performance.now() < stop) {
        const t0 = performance.now();
        try {
          const release = await acquire(warden, client, Number.POSITIVE_INFINITY);
          if (release === null) continue;
          lat.push(performance.now() - t0);
          inside += 1;
          maxInside = Math.max(maxInside, inside);
          await client.incr(`${p.key}:work`);
          inside -= 1;
          await release();
        } catch (e) {
          failed(e);
        }
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const cpu = process.cpuUsage(cpu0);
  const server = (await serverCpu(client)) - server0;
  await warden.close();
  Object.assign(out, {
    acquisitions: lat.length,
    seconds,
    rate: lat.length / seconds,
    lat_ms: lat,
    max_inside: maxInside,
    client_cpu_us: (cpu.user + cpu.system) / lat.length,
    server_cpu_us: server / lat.length,
  });
}

const client = new Redis({ host: "127.0.0.1", port: num("port"), lazyConnect: true });
await client.connect();
await client.ping();
const scenarios = { overload, burst, throughput };
if (!scenarios[p.scenario]) throw new Error(`unknown scenario ${p.scenario}`);
await scenarios[p.scenario](client);
client.disconnect();
console.log(JSON.stringify(out));
