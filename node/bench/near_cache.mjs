// The near-cache bench's Node driver (bench/near_cache.py runs it; `make bench
// SECTION=near-cache`). One run of one client against a server with the
// module; node-redis 5 (the `redis` package, pinned in node/package-lock.json).
//
// Parameters (`--name value`): --port P --prefix K --keys 4 --seconds 5
//   --hits 200000
//   --client C:
//     get              a plain `await client.get(k)` per read (no near cache)
//     node-redis-csc   createClient({ RESP: 3, clientSideCache: { ttl: 0,
//                      maxEntries: 0, evictPolicy: "LRU" } }): node-redis'
//                      client-side cache on CLIENT TRACKING
//     warden           warden-redis' near cache, warden.cache({ near: true }) on a
//                      node-redis client, getOrLoad(key, loader); exits with a
//                      message while the package has no near cache (near-node)
//   --version prints the packages' versions.
//
// Protocol as bench/near_cache_python.py: a warm-up, the hit latency (hits
// reads of K:hit, each timed alone with process.hrtime.bigint(), the timer
// included), READY; on GO the race: one reader reads K:0 … K:keys-1 in turn
// for `seconds`, noting each read's start (process.hrtime.bigint():
// CLOCK_MONOTONIC, as the writer's time.monotonic_ns) and the value; then
// `RESULT {json}` with the reads run-length coded. A cache hit still resolves
// a promise, and a loop of awaited promises never lets the event loop read
// the socket: the reader yields (setImmediate) every YIELD_EVERY reads, as an
// application serving requests would, so invalidations are read.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import { setImmediate as yieldLoop } from "node:timers/promises";
import { createClient } from "redis";

const BUCKET_NS = 2000n;
const YIELD_EVERY = 100;

const args = {};
for (let i = 2; i < process.argv.length; i++) {
  const a = process.argv[i];
  if (a === "--version") args.version = true;
  else if (a.startsWith("--")) args[a.slice(2)] = process.argv[++i];
}

if (args.version) {
  const require = createRequire(import.meta.url);
  const pkg = JSON.parse(readFileSync(require.resolve("@redis/client/package.json"), "utf8"));
  console.log(JSON.stringify({ "node-redis": pkg.version, node: process.versions.node }));
  process.exit(0);
}

const port = Number(args.port);
const prefix = args.prefix;
const nKeys = Number(args.keys ?? 4);
const seconds = Number(args.seconds ?? 5);
const hits = Number(args.hits ?? 200000);

function pct(xs, p) {
  const s = Float64Array.from(xs).sort();
  return s.length ? s[Math.min(s.length - 1, Math.floor((s.length * p) / 100))] : Number.NaN;
}

async function makeClient() {
  if (args.client === "get") return createClient({ socket: { port } }).connect();
  if (args.client === "node-redis-csc")
    return createClient({
      socket: { port },
      RESP: 3,
      clientSideCache: { ttl: 0, maxEntries: 0, evictPolicy: "LRU" },
    }).connect();
  if (args.client === "warden") {
    // warden-redis' near cache (docs/clients/node.md "Near cache"): warden.cache({ near: true })
    // on a node-redis client; a read is getOrLoad(key, loader) (values JSON: the writer's
    // integers parse as numbers; the loader, never expected to run, throws).
    const { Warden } = await import("../dist/esm/index.js");
    const redis = await createClient({ socket: { port } }).connect();
    const warden = new Warden(redis);
    const cache = warden.cache({ ttl: 300000, near: true });
    if (!cache.near) {
      console.error("warden's Node near cache is not in this checkout yet (near-node not merged)");
      process.exit(2);
    }
    await cache.near.ready();
    const loader = async () => {
      throw new Error("the loader ran: the key is missing");
    };
    return {
      get: (k) => cache.getOrLoad(k, loader),
      wardenStats: () => cache.near.stats(),
      close: async () => {
        await warden.close();
        await redis.close();
      },
    };
  }
  console.error(`unknown client ${args.client}`);
  process.exit(2);
}

const client = await makeClient();
const keys = Array.from({ length: nKeys }, (_, i) => `${prefix}:${i}`);
const hit = `${prefix}:hit`;
for (let i = 0; i < 1000; i++) {
  await client.get(hit);
  for (const k of keys) await client.get(k);
}
const lat = new Array(hits);
for (let i = 0; i < hits; i++) {
  const t0 = process.hrtime.bigint();
  await client.get(hit);
  lat[i] = Number(process.hrtime.bigint() - t0);
  if (i % YIELD_EVERY === 0) await yieldLoop();
}
console.log("READY");

const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const first = await lines.next();
if (first.value?.trim() !== "GO") process.exit(0);

const entries = [];
const cur = new Array(nKeys).fill(null);
let reads = 0;
const tStart = process.hrtime.bigint();
const end = tStart + BigInt(Math.round(seconds * 1e9));
let i = 0;
for (;;) {
  const t = process.hrtime.bigint();
  if (t >= end) break;
  const v = Number(await client.get(keys[i]));
  const e = cur[i];
  if (e !== null && e[1] === v && t - e[2] <= BUCKET_NS) {
    e[3] = t;
    e[4]++;
  } else {
    const n = [i, v, t, t, 1];
    entries.push(n);
    cur[i] = n;
  }
  reads++;
  i = (i + 1) % nKeys;
  if (reads % YIELD_EVERY === 0) await yieldLoop();
}
const tEnd = process.hrtime.bigint();
const info = {};
if (client.wardenStats) {
  const s = client.wardenStats();
  info.info_hits = s.hits;
  info.info_misses = s.misses;
  info.info_invalidations = s.invalidations;
} else if (client.clientSideCache?.stats) {
  const s = client.clientSideCache.stats();
  info.info_hits = s.hitCount;
  info.info_misses = s.missCount;
}
await client.close();
// console.log on a pipe is asynchronous: exit once the line is written.
process.stdout.write(
  `RESULT ${JSON.stringify({
    reads,
    seconds: Number(tEnd - tStart) / 1e9,
    entries: entries.map((e) => [e[0], e[1], Number(e[2]), Number(e[3]), e[4]]),
    hit_ns_p50: pct(lat, 50),
    hit_ns_p99: pct(lat, 99),
    hits,
    timer: "process.hrtime.bigint() around each awaited read",
    ...info,
  })}\n`,
  () => process.exit(0),
);
