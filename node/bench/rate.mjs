// The rate bench's Node driver (bench/rate.py runs it; `make bench
// SECTION=rate`): `callers` async callers, each wanting to be admitted by one
// rate limiter as soon as possible, again and again, for `seconds`. One run
// of one client against a server with the module; ioredis for all.
//
// Parameters (`--name value`):
//   --port P --key K --count 200 --period 1000 (ms) --burst 10
//   --callers 16 --seconds 10
//   --client C:
//     warden-wait       RATE.ACQUIRE key count period BURST b WAIT 10000, one
//                       command per admission, each caller on a connection of
//                       its own (as warden-redis's waiter connections: a
//                       blocking command holds its connection)
//     warden-retry      RATE.ACQUIRE without WAIT on one shared connection;
//                       when limited, sleep retry_after ms and ask again
//     rlf               rate-limiter-flexible's RateLimiterRedis
//                       ({ points: count, duration: period / 1000 }: a fixed
//                       window, no burst of its own) on one shared connection;
//                       when rejected, sleep msBeforeNext and consume again
//     rlf-queue         the same limiter behind its RateLimiterQueue
//                       (removeTokens(1, key): an in-process FIFO that waits
//                       msBeforeNext and consumes again)
//   --version prints the packages' versions.
//
// Protocol: after a warm-up (connections open, scripts defined, on K:warm) it
// prints READY; on a line GO on stdin it runs and prints one line
// `RESULT {json}`: "admits" (per caller, ms from the run's start of each
// admission), "waits" (ms from wanting an admission to having it, in the
// order of "admits" flattened), "sent"
// (commands ioredis sent during the run), "refused" (replies that admitted
// nothing; rlf-queue: not seen), "errors", "error_sample". A caller
// stops asking at `seconds`; an admission it already asked for still counts.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { createInterface } from "node:readline";
import { Redis } from "ioredis";
import { RateLimiterQueue, RateLimiterRedis, RateLimiterRes } from "rate-limiter-flexible";

const require = createRequire(import.meta.url);

function versionOf(pkg) {
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
  console.log(
    JSON.stringify({
      "rate-limiter-flexible": versionOf("rate-limiter-flexible"),
      ioredis: versionOf("ioredis"),
      node: process.versions.node,
    }),
  );
  process.exit(0);
}
const p = {};
for (let i = 0; i < args.length; i += 2) p[args[i].replace(/^--/, "")] = args[i + 1];
const num = (name, dflt) => (p[name] === undefined ? dflt : Number(p[name]));
const port = num("port");
const count = num("count", 200);
const period = num("period", 1000);
const burst = num("burst", 10);
const callers = num("callers", 16);
const seconds = num("seconds", 10);

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

let counting = false;
let sent = 0;
/** Replies that admitted nothing (warden-wait: answered limited despite WAIT). */
let refused = 0;
/** An ioredis connection whose commands are counted while `counting`. */
async function connection() {
  const r = new Redis({ port, host: "127.0.0.1", lazyConnect: true });
  await r.connect();
  const send = r.sendCommand.bind(r);
  r.sendCommand = (cmd, stream) => {
    if (counting) sent += 1;
    return send(cmd, stream);
  };
  return r;
}

const rate = [count, period, "BURST", burst];
const shared = await connection();
let admitter; // (caller index) => (key) => Promise<void>
if (p.client === "warden-wait") {
  const own = await Promise.all(Array.from({ length: callers }, connection));
  admitter = (i) => async (key) => {
    for (;;) {
      const reply = await own[i].call("RATE.ACQUIRE", key, ...rate, "WAIT", 10000);
      if (reply[0] === 0) return;
      refused += 1;
    }
  };
} else if (p.client === "warden-retry") {
  admitter = () => async (key) => {
    for (;;) {
      const reply = await shared.call("RATE.ACQUIRE", key, ...rate);
      if (reply[0] === 0) return;
      refused += 1;
      await sleep(reply[3]);
    }
  };
} else if (p.client === "rlf" || p.client === "rlf-queue") {
  const limiter = new RateLimiterRedis({
    storeClient: shared,
    points: count,
    duration: period / 1000,
    keyPrefix: "rlf",
  });
  if (p.client === "rlf") {
    admitter = () => async (key) => {
      for (;;) {
        try {
          await limiter.consume(key);
          return;
        } catch (e) {
          if (!(e instanceof RateLimiterRes)) throw e;
          refused += 1;
          await sleep(e.msBeforeNext);
        }
      }
    };
  } else {
    const queue = new RateLimiterQueue(limiter);
    admitter = () => async (key) => {
      await queue.removeTokens(1, key);
    };
  }
} else {
  console.error(`unknown --client ${p.client}`);
  process.exit(2);
}

// Warm-up: connections open, scripts defined.
await Promise.all(Array.from({ length: callers }, (_, i) => admitter(i)(`${p.key}:warm`)));
console.log("READY");
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();
const go = await lines.next();
if (go.done || go.value.trim() !== "GO") process.exit(0);

const admits = Array.from({ length: callers }, () => []);
const waits = Array.from({ length: callers }, () => []);
let errors = 0;
let errorSample = "";
counting = true;
refused = 0;
const t0 = performance.now();
const end = t0 + seconds * 1000;
await Promise.all(
  Array.from({ length: callers }, async (_, i) => {
    const admit = admitter(i);
    for (;;) {
      const asked = performance.now();
      if (asked >= end) return;
      try {
        await admit(p.key);
      } catch (e) {
        errors += 1;
        errorSample = String(e?.message ?? e).slice(0, 200);
        await sleep(10);
        continue;
      }
      const now = performance.now();
      admits[i].push(now - t0);
      waits[i].push(now - asked);
    }
  }),
);
counting = false;
console.log(
  `RESULT ${JSON.stringify({ admits, waits: waits.flat(), sent, refused, errors, error_sample: errorSample })}`,
);
await lines.next();
process.exit(0);
