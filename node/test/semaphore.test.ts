import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Redis } from "ioredis";
import {
  LockBusyError,
  LockLostError,
  type Permit,
  ReplyError,
  SemaphoreLimitError,
  Warden,
} from "warden-redis";
import { type AppClient, CLIENTS, Server, info, sleep, until } from "./servers.js";

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

const semInfo = (key: string) => info(admin, key, "SEM.INFO");

for (const kind of CLIENTS) {
  describe(`semaphores with ${kind.name}`, () => {
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

    test("20 concurrent tasks of mixed weights never exceed the limit", async () => {
      const key = `${kind.name}:bound`;
      const sem = warden.semaphore(key, 4);
      let inside = 0;
      let most = 0;
      const fences = new Set<bigint>();
      await Promise.all(
        Array.from({ length: 20 }, async (_, i) => {
          await using permit = await sem.acquire({ permits: 1 + (i % 3), ttl: 10000 });
          inside += permit.permits;
          most = Math.max(most, inside);
          fences.add(permit.fence);
          await sleep(1);
          inside -= permit.permits;
        }),
      );
      assert.ok(most <= 4, `${most} permits held at once`);
      assert.equal(fences.size, 20, "every hold its own fence");
      assert.equal(await semInfo(key), null);
    });

    test("a request for 3 is not overtaken by later requests for 1", async () => {
      const key = `${kind.name}:fifo`;
      const sem = warden.semaphore(key, 3);
      const first = await sem.acquire({ ttl: 30000 });
      const order: string[] = [];
      const big = sem.acquire({ permits: 3, ttl: 30000 }).then((p) => {
        order.push("big");
        return p;
      });
      await until(async () => (await semInfo(key)).waiters === 1, "the request for 3 to queue");
      const small = sem.acquire({ ttl: 30000 }).then((p) => {
        order.push("small");
        return p;
      });
      await until(async () => (await semInfo(key)).waiters === 2, "the request for 1 to queue");
      // Two permits are free, yet the request for 1 waits behind the one for 3.
      assert.equal((await semInfo(key)).used, 1);
      assert.equal(await sem.tryAcquire({ ttl: 1000 }), null, "nor is it overtaken");
      await first.release();
      const b = await big;
      assert.deepEqual(order, ["big"]);
      assert.equal((await semInfo(key)).used, 3);
      await b.release();
      const s = await small;
      assert.deepEqual(order, ["big", "small"]);
      assert.ok(s.fence > b.fence);
      await s.release();
    });

    test("an aborted wait gives back permits in flight", async () => {
      for (let round = 0; round < 20; round++) {
        const key = `${kind.name}:abort-granted:${round}`;
        await admin.call("SEM.ACQUIRE", key, "holder", 30000, "LIMIT", 2, "PERMITS", 2);
        const abort = new AbortController();
        const sem = warden.semaphore(key, 2);
        const outcome = sem.acquire({ permits: 2, ttl: 30000, signal: abort.signal }).then(
          async (permit) => {
            await permit.release(); // granted before the abort: ours to release
            return "granted";
          },
          (error: Error) => error.name,
        );
        await until(async () => (await semInfo(key)).waiters === 1, "the waiter to queue");
        // The release hands the permits to the waiter while it aborts.
        const released = admin.call("SEM.RELEASE", key, "holder");
        if (round % 2) await sleep(0);
        abort.abort();
        assert.equal(await released, 1);
        assert.ok(["granted", "AbortError"].includes(await outcome));
        await until(async () => (await semInfo(key)) === null, "the permits to be given back");
      }
    });

    test("an aborted wait leaves the queue", async () => {
      const key = `${kind.name}:abort-queued`;
      const sem = warden.semaphore(key, 1);
      const held = await sem.acquire({ ttl: 30000 });
      const abort = new AbortController();
      const waiting = sem.acquire({ ttl: 10000, signal: abort.signal });
      await until(async () => (await semInfo(key)).waiters === 1, "the waiter to queue");
      abort.abort();
      await assert.rejects(waiting, { name: "AbortError" });
      await until(async () => (await semInfo(key)).waiters === 0, "the waiter to leave");
      await held.release();
      assert.equal(await semInfo(key), null, "nobody was granted");
    });

    test("another limit throws SemaphoreLimitError until setLimit changes it", async () => {
      const key = `${kind.name}:limit`;
      const held = await warden.semaphore(key, 2).acquire({ ttl: 30000 });
      const other = warden.semaphore(key, 3);
      await assert.rejects(other.tryAcquire({ ttl: 1000 }), (error: unknown) => {
        assert.ok(error instanceof SemaphoreLimitError);
        assert.ok(error instanceof ReplyError);
        assert.equal(error.limit, 2);
        assert.equal(error.requested, 3);
        assert.equal(error.message, "ERR semaphore limit is 2, not 3");
        return true;
      });
      await assert.rejects(other.acquire({ ttl: 1000 }), SemaphoreLimitError);
      assert.equal(await other.setLimit(3), true);
      assert.equal(other.limit, 3);
      const more = await other.acquire({ permits: 2, ttl: 30000 });
      assert.deepEqual(await other.info(), { limit: 3, used: 3, holders: 2, waiters: 0 });
      await held.release();
      await more.release();
      assert.equal(await other.info(), null);
      assert.equal(await other.setLimit(5), false, "no semaphore left");
      await (await other.acquire({ ttl: 1000 })).release();
    });

    test("a lowered limit fails a waiter asking for more", async () => {
      const key = `${kind.name}:lowered`;
      const sem = warden.semaphore(key, 4);
      const held = await sem.acquire({ ttl: 30000 });
      // Its refusal may come in before the test awaits it: caught at once.
      const big = sem.acquire({ permits: 4, ttl: 30000 }).then(
        () => assert.fail("granted above the lowered limit"),
        (error: unknown) => error,
      );
      await until(async () => (await semInfo(key)).waiters === 1, "the waiter to queue");
      assert.equal(await sem.setLimit(2), true);
      const error = await big;
      assert.ok(error instanceof ReplyError);
      assert.match(error.message, /limit was lowered/);
      assert.deepEqual(await sem.info(), { limit: 2, used: 1, holders: 1, waiters: 0 });
      await held.release();
    });

    test("tryAcquire answers null and acquire LockBusyError when full", async () => {
      const key = `${kind.name}:busy`;
      const sem = warden.semaphore(key, 1);
      const held = await sem.acquire({ ttl: 10000 });
      assert.equal(await sem.tryAcquire({ ttl: 1000 }), null);
      await assert.rejects(sem.acquire({ ttl: 1000, wait: 50 }), LockBusyError);
      await held.release();
      const next = await sem.tryAcquire({ ttl: 1000 });
      assert.ok(next);
      assert.ok(next.fence > held.fence);
      await next.release();
    });

    test("await using and using() release the permits", async () => {
      const key = `${kind.name}:using`;
      const sem = warden.semaphore(key, 2);
      {
        await using permit = await sem.acquire({ permits: 2, ttl: 10000 });
        assert.equal((await semInfo(key)).used, permit.permits);
      }
      assert.equal(await semInfo(key), null);
      const result = await sem.using(1000, { permits: 2 }, async (signal, permit: Permit) => {
        assert.equal(signal.aborted, false);
        assert.equal(permit.permits, 2);
        assert.equal((await semInfo(key)).used, 2);
        return "done";
      });
      assert.equal(result, "done");
      assert.equal(await semInfo(key), null);
    });

    test("permits taken away from the watchdog report lost", async () => {
      const key = `${kind.name}:lost`;
      const permit = await warden.semaphore(key, 2).acquire({ ttl: 300, watchdog: true });
      const lost = new Promise((resolve) => permit.lost.addEventListener("abort", resolve));
      await admin.del(key);
      await lost;
      assert.ok(permit.lost.reason instanceof LockLostError);
      assert.equal(permit.held, false);
      await assert.rejects(permit.release(), LockLostError);
    });

    test("extend resets the lease; a lease that ends returns the permits", async () => {
      const key = `${kind.name}:extend`;
      const permit = await warden.semaphore(key, 1).acquire({ ttl: 1000 });
      await permit.extend(60000);
      assert.ok((await admin.pttl(key)) > 30000);
      await permit.extend(50);
      await new Promise((resolve) => permit.lost.addEventListener("abort", resolve));
      await until(async () => (await semInfo(key)) === null, "the lease to end");
      await assert.rejects(permit.extend(), LockLostError);
    });
  });
}

test("the watchdog renews a semaphore's lease until release", async () => {
  const { Redis } = await import("ioredis");
  const app = new Redis({ path: server.socket });
  // A 1 s lease: a shorter one is lost whenever a busy machine stalls the
  // event loop past it.
  const warden = new Warden(app, { watchdogLease: 1000 });
  try {
    const renewals = async () =>
      Number(/cmdstat_sem\.extend:calls=(\d+)/.exec(await admin.info("commandstats"))?.[1] ?? 0);
    const start = await renewals();
    const permit = await warden.semaphore("watchdog", 3).acquire();
    await until(async () => (await renewals()) >= start + 4, "four renewals", 20000);
    assert.equal(permit.held, true);
    assert.equal((await semInfo("watchdog")).used, 1);
    await permit.release();
    assert.equal(await semInfo("watchdog"), null);
  } finally {
    await warden.close();
    app.disconnect();
  }
});
