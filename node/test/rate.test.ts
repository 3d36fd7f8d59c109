// Rate limiters against a real server, with every application client.
// Rates are chosen so that a test asserts an order or a count, never a
// speed: the tokens a test waits for conform hundreds of ms apart, and the
// ones that must not come are a minute away.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Redis } from "ioredis";
import {
  type RateDecision,
  type RateLimiter,
  RateMismatchError,
  ReplyError,
  Warden,
} from "warden-redis";
import { type AppClient, CLIENTS, Server, sleep, until } from "./servers.js";

let server: Server;
let admin: Redis;
before(async () => {
  server = await Server.start();
  admin = server.admin();
});
after(async () => {
  admin?.disconnect();
  await server?.stop();
});

const waiters = async (limiter: RateLimiter) => (await limiter.info())?.waiters ?? 0;

/** RATE.REFUND commands the server ran. */
async function refunds(): Promise<number> {
  const stats = String(await admin.call("INFO", "commandstats"));
  const m = /^cmdstat_rate\.refund:calls=(\d+)/m.exec(stats);
  return m === null ? 0 : Number(m[1]);
}

for (const kind of CLIENTS) {
  describe(`rate limiters with ${kind.name}`, () => {
    let app: AppClient;
    let warden: Warden;
    before(async () => {
      app = await kind.open(server);
      warden = new Warden(app.client);
    });
    after(async () => {
      await warden?.close();
      await app?.close();
    });
    const key = (name: string) => `${kind.name}:${name}`;

    test("allowed, then limited: the server's five integers", async () => {
      // 10 a minute, burst 2: a token every 6 s.
      const limiter = warden.rateLimiter(key("api"), { count: 10, period: 60000, burst: 2 });
      assert.deepEqual(await limiter.acquire(), {
        allowed: true,
        burst: 2,
        remaining: 1,
        retryAfter: null,
        resetAfter: 6000,
      } satisfies RateDecision);
      const second = await limiter.tryAcquire();
      assert.equal(second.allowed, true);
      assert.equal(second.remaining, 0);
      assert.ok(second.resetAfter > 11000 && second.resetAfter <= 12000);
      const third = await limiter.acquire(1, { wait: 0 });
      assert.equal(third.allowed, false);
      assert.equal(third.burst, 2);
      assert.equal(third.remaining, 0);
      assert.ok(third.retryAfter !== null && third.retryAfter > 5000 && third.retryAfter <= 6000);
      const info = await limiter.info();
      assert.ok(info !== null);
      assert.deepEqual(
        [info.count, info.period, info.burst, info.remaining, info.waiters],
        [10, 60000, 2, 0, 0],
      );
    });

    test("info of a missing limiter is null", async () => {
      assert.equal(await warden.rateLimiter(key("nobody"), { count: 1, period: 1 }).info(), null);
    });

    test("waiters are granted in the order they asked", async () => {
      // 2 a second, burst 2, emptied: the first waiter's 2 tokens conform at
      // 1 s; the second asks for 1 (alone: 0.5 s) and comes after it, at 1.5 s.
      const limiter = warden.rateLimiter(key("fifo"), { count: 2, period: 1000 });
      assert.ok((await limiter.acquire(2)).allowed);
      const granted: string[] = [];
      const ask = async (name: string, cost: number) => {
        if ((await limiter.acquire(cost, { wait: 30000 })).allowed) granted.push(name);
      };
      const first = ask("two tokens", 2);
      await until(async () => (await waiters(limiter)) === 1, "the first waiter");
      const second = ask("one token", 1);
      await Promise.all([first, second]);
      assert.deepEqual(granted, ["two tokens", "one token"]);
    });

    test("a wait that cannot conform in time is answered at once", async () => {
      const limiter = warden.rateLimiter(key("slow"), { count: 1, period: 60000, wait: 5000 });
      assert.ok((await limiter.acquire()).allowed);
      const t0 = performance.now();
      const d = await limiter.acquire();
      assert.ok(performance.now() - t0 < 5000);
      assert.equal(d.allowed, false);
      assert.ok(d.retryAfter !== null && d.retryAfter > 55000 && d.retryAfter <= 60000);
    });

    test("the waiters ahead count toward conforming in time", async () => {
      // 2 every 4 s: a waiter ahead takes the first 4 s's tokens, so one
      // more conforms at 6 s, past a 4.5 s wait asked up to 1.5 s after the
      // start (time a busy machine may take to queue the waiter ahead).
      const limiter = warden.rateLimiter(key("ahead"), { count: 2, period: 4000 });
      assert.ok((await limiter.acquire(2)).allowed);
      const ahead = limiter.acquire(2, { wait: 30000 });
      await until(async () => (await waiters(limiter)) === 1, "the waiter ahead");
      const t0 = performance.now();
      const d = await limiter.acquire(1, { wait: 4500 });
      assert.ok(performance.now() - t0 < 4500);
      assert.equal(d.allowed, false);
      assert.ok(d.retryAfter !== null && d.retryAfter > 4500, `retryAfter ${d.retryAfter}`);
      assert.ok((await ahead).allowed);
    });

    test("an aborted wait takes nothing", async () => {
      // A token a minute, burst 2, one left: a request for 2 waits a minute.
      const limiter = warden.rateLimiter(key("abort"), { count: 1, period: 60000, burst: 2 });
      assert.ok((await limiter.acquire()).allowed);
      const abort = new AbortController();
      const waiting = limiter.acquire(2, { signal: abort.signal });
      await until(async () => (await waiters(limiter)) === 1, "the waiter");
      abort.abort(new Error("gave up"));
      await assert.rejects(waiting, /gave up/);
      const info = await limiter.info();
      assert.deepEqual([info?.waiters, info?.remaining], [0, 1]);
      assert.ok((await limiter.tryAcquire()).allowed, "nobody waits ahead");
    });

    test("an aborted signal sends nothing", async () => {
      const limiter = warden.rateLimiter(key("aborted"), { count: 1, period: 60000 });
      await assert.rejects(limiter.acquire(1, { signal: AbortSignal.abort() }), {
        name: "AbortError",
      });
      assert.equal(await limiter.info(), null);
    });

    test("refund gives tokens back", async () => {
      const limiter = warden.rateLimiter(key("refund"), { count: 5, period: 60000 });
      assert.equal((await limiter.acquire(5)).remaining, 0);
      assert.equal(await limiter.refund(2), true);
      assert.equal((await limiter.info())?.remaining, 2);
      assert.ok((await limiter.acquire(2, { wait: 0 })).allowed);
      const none = warden.rateLimiter(key("refund-none"), { count: 5, period: 60000 });
      assert.equal(await none.refund(1), false);
    });

    test("setRate changes the rate, keeping what is owed", async () => {
      const limiter = warden.rateLimiter(key("config"), { count: 10, period: 1000 });
      assert.ok((await limiter.acquire(10)).allowed);
      assert.equal(await limiter.setRate({ count: 20, period: 1000, burst: 20 }), true);
      assert.deepEqual([limiter.count, limiter.period, limiter.burst], [20, 1000, 20]);
      const d = await limiter.acquire(10, { wait: 0 });
      assert.deepEqual([d.allowed, d.burst, d.remaining], [true, 20, 0]);
      const missing = warden.rateLimiter(key("config-missing"), { count: 1, period: 1000 });
      assert.equal(await missing.setRate({ count: 2, period: 1000 }), false);
    });

    test("setRate answers the waiters of the old rate with an error", async () => {
      const limiter = warden.rateLimiter(key("reconfigured"), { count: 1, period: 60000 });
      assert.ok((await limiter.acquire()).allowed);
      const waiting = limiter.acquire(1, { wait: 120000 }).catch((e: unknown) => e);
      await until(async () => (await waiters(limiter)) === 1, "the waiter");
      const other = warden.rateLimiter(key("reconfigured"), { count: 1, period: 60000 });
      assert.equal(await other.setRate({ count: 2, period: 60000 }), true);
      const error = await waiting;
      assert.ok(error instanceof ReplyError, String(error));
      assert.equal(error.message, "ERR the limiter's rate was changed while this request waited");
    });

    test("another rate is a RateMismatchError with the server's message", async () => {
      const limiter = warden.rateLimiter(key("calls"), { count: 10, period: 1000, burst: 2 });
      assert.ok((await limiter.acquire()).allowed);
      for (const wait of [0, 1000]) {
        const other = warden.rateLimiter(key("calls"), { count: 5, period: 1000 });
        const error = await other.acquire(1, { wait }).catch((e: unknown) => e);
        assert.ok(error instanceof RateMismatchError, String(error));
        assert.ok(error instanceof ReplyError);
        assert.equal(
          error.message,
          "ERR limiter rate is 10 per 1000 ms burst 2, not 5 per 1000 ms burst 5",
        );
        assert.deepEqual(error.rate, { count: 10, period: 1000, burst: 2 });
        assert.deepEqual(error.requested, { count: 5, period: 1000, burst: 5 });
      }
      assert.equal((await limiter.info())?.remaining, 1, "nothing changed");
    });

    test("maxQueue sheds instead of queueing", async () => {
      const rate = { count: 1, period: 60000, burst: 2 };
      const limiter = warden.rateLimiter(key("shed"), rate);
      assert.ok((await limiter.acquire()).allowed);
      const abort = new AbortController();
      const ahead = limiter.acquire(2, { signal: abort.signal }).catch((e: unknown) => e);
      await until(async () => (await waiters(limiter)) === 1, "the waiter ahead");
      const shedding = warden.rateLimiter(key("shed"), { ...rate, wait: 300000, maxQueue: 1 });
      const d = await shedding.acquire();
      assert.equal(d.allowed, false);
      assert.ok(d.retryAfter !== null);
      assert.equal(await waiters(limiter), 1);
      abort.abort();
      assert.ok((await ahead) instanceof Error);
      assert.equal(await waiters(limiter), 0);
    });
  });
}

describe("rate limiters: arguments and edges", () => {
  let app: AppClient;
  let warden: Warden;
  before(async () => {
    app = await (CLIENTS[0] as (typeof CLIENTS)[number]).open(server);
    warden = new Warden(app.client);
  });
  after(async () => {
    await warden?.close();
    await app?.close();
  });

  test("invalid arguments are refused before anything is sent", async () => {
    const ok = { count: 1, period: 1000 };
    const cases: [string, () => unknown][] = [
      ["count", () => warden.rateLimiter("k", { count: 0, period: 1000 })],
      ["count", () => warden.rateLimiter("k", { count: 1.5, period: 1000 })],
      ["period", () => warden.rateLimiter("k", { count: 1, period: 0 })],
      ["period", () => warden.rateLimiter("k", { count: 1, period: 1.5 })],
      ["period", () => warden.rateLimiter("k", { count: 1, period: Number.NaN })],
      ["burst", () => warden.rateLimiter("k", { ...ok, burst: 0 })],
      ["wait", () => warden.rateLimiter("k", { ...ok, wait: -1 })],
      ["wait", () => warden.rateLimiter("k", { ...ok, wait: Number.NaN })],
      ["maxQueue", () => warden.rateLimiter("k", { ...ok, maxQueue: -1 })],
    ];
    for (const [name, make] of cases) {
      assert.throws(make, (e: unknown) => e instanceof RangeError && e.message.startsWith(name));
    }
    const limiter = warden.rateLimiter("k", ok);
    const calls: [string, () => Promise<unknown>][] = [
      ["cost", () => limiter.acquire(0)],
      ["cost", () => limiter.tryAcquire(-1)],
      ["cost", () => limiter.refund(0)],
      ["wait", () => limiter.acquire(1, { wait: -5 })],
      ["period", () => limiter.setRate({ count: 1, period: 0.5 })],
    ];
    for (const [name, call] of calls) {
      await assert.rejects(
        call,
        (e: unknown) => e instanceof RangeError && e.message.startsWith(name),
      );
    }
    assert.equal(await admin.exists("k"), 0);
  });

  test("out-of-range arguments are the server's errors", async () => {
    const cases: [() => Promise<unknown>, string][] = [
      [
        () => warden.rateLimiter("k", { count: 1000001, period: 1 }).acquire(),
        "ERR invalid count: expected an integer from 1 to 1000000 per ms of the period",
      ],
      [
        () => warden.rateLimiter("k", { count: 1, period: 86400001 }).acquire(),
        "ERR invalid period: expected an integer from 1 to 86400000 (ms)",
      ],
      [
        () => warden.rateLimiter("k", { count: 1, period: 1000, burst: 1e9 + 1 }).acquire(),
        "ERR invalid BURST: expected an integer from 1 to 1000000000",
      ],
      [
        () => warden.rateLimiter("k", { count: 10, period: 1000, burst: 2 }).acquire(3),
        "ERR invalid COST: expected an integer from 1 to the burst",
      ],
    ];
    for (const [call, message] of cases) {
      await assert.rejects(call, (e: unknown) => e instanceof ReplyError && e.message === message);
    }
    assert.equal(await admin.exists("k"), 0);
  });

  test("a key of another type is WRONGTYPE", async () => {
    await admin.set("plain", "data");
    await assert.rejects(warden.rateLimiter("plain", { count: 1, period: 1000 }).acquire(), {
      name: "ReplyError",
      message: /^WRONGTYPE/,
    });
  });

  test("a stalled server: answered by the deadline, a late grant is given back", async () => {
    const limiter = warden.rateLimiter("stalled", { count: 1, period: 60000 });
    assert.equal(await limiter.info(), null); // the command connection is open
    const before = await refunds();
    // A pause far longer than the wait: only "not at the pause's end" is
    // checked, with slack for a busy machine.
    await admin.call("CLIENT", "PAUSE", "4000", "ALL");
    const t0 = performance.now();
    const d = await limiter.acquire(1, { wait: 100 });
    const took = performance.now() - t0;
    assert.deepEqual([d.allowed, d.retryAfter], [false, null]);
    assert.ok(took < 3000, `answered after ${took} ms`); // not at the pause's end
    await admin.call("CLIENT", "UNPAUSE");
    await until(async () => (await refunds()) === before + 1, "the late grant given back");
    assert.equal(await limiter.info(), null);
  });

  test("an abort of a try in flight gives a late grant back", async () => {
    const limiter = warden.rateLimiter("abort-try", { count: 1, period: 60000 });
    assert.equal(await limiter.info(), null);
    const before = await refunds();
    await admin.call("CLIENT", "PAUSE", "4000", "ALL");
    const abort = new AbortController();
    const trying = limiter.acquire(1, { signal: abort.signal });
    await sleep(50);
    abort.abort();
    await assert.rejects(trying, { name: "AbortError" });
    await admin.call("CLIENT", "UNPAUSE");
    await until(async () => (await refunds()) === before + 1, "the late grant given back");
    assert.equal(await limiter.info(), null);
  });
});
