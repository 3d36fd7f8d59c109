// The near cache's hit against a CACHE.GET hit (one round trip), on one
// server, ioredis: median ns per read over rounds of tight loops.
//
//   node bench/near.mjs [--quick]    (after npm run build and the tests'
//                                     tsc; WARDEN_SERVER, WARDEN_MODULE as
//                                     for the tests)

import { Server } from "../build/test/servers.js";
import { Warden } from "../dist/esm/index.js";

const quick = process.argv.includes("--quick");
const HITS = quick ? 100_000 : 1_000_000;
const TRIPS = quick ? 2_000 : 20_000;
const ROUNDS = 5;

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const server = await Server.start();
const { Redis } = await import("ioredis");
const client = new Redis({ path: server.socket });
const warden = new Warden(client);
try {
  const near = warden.cache({ prefix: "bench:", near: true });
  const plain = warden.cache({ prefix: "bench:" });
  await near.near.ready();
  const load = async () => ({ id: 42, name: "product" });
  await plain.getOrLoad("k", load);
  await near.getOrLoad("k", load);
  await near.getOrLoad("k", load); // held from here on
  const hits = [];
  const trips = [];
  for (let round = 0; round < ROUNDS; round++) {
    let t = process.hrtime.bigint();
    for (let i = 0; i < HITS; i++) await near.getOrLoad("k", load);
    hits.push(Number(process.hrtime.bigint() - t) / HITS);
    t = process.hrtime.bigint();
    for (let i = 0; i < TRIPS; i++) await plain.getOrLoad("k", load);
    trips.push(Number(process.hrtime.bigint() - t) / TRIPS);
  }
  const stats = near.near.stats();
  console.log(
    `near cache hit: ${median(hits).toFixed(0)} ns (median of ${ROUNDS} x ${HITS}); ` +
      `CACHE.GET hit: ${(median(trips) / 1000).toFixed(1)} us (median of ${ROUNDS} x ${TRIPS}, unix socket); ` +
      `hits ${stats.hits}, misses ${stats.misses}`,
  );
} finally {
  await warden.close();
  client.disconnect();
  await server.stop();
}
