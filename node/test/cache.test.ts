import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Redis } from "ioredis";
import { type Cache, Warden } from "warden-redis";
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

/** One field of CACHE.INFO. */
async function cacheInfo(key: string, field: string): Promise<unknown> {
  const reply = (await admin.call("CACHE.INFO", key)) as unknown[];
  return reply[reply.indexOf(field) + 1];
}

for (const kind of CLIENTS) {
  describe(`cache with ${kind.name}`, () => {
    let app: AppClient;
    let warden: Warden;
    let cache: Cache;
    before(async () => {
      app = await kind.open(server);
      warden = new Warden(app.client, { maxWaiters: 8 });
      cache = warden.cache({ prefix: `${kind.name}:`, ttl: 60000 });
    });
    after(async () => {
      await warden?.close();
      await app?.close();
    });

    test("50 concurrent callers load once", async () => {
      let loads = 0;
      const load = async () => {
        loads += 1;
        await sleep(50);
        return { id: 42 };
      };
      const values = await Promise.all(
        Array.from({ length: 50 }, () => cache.getOrLoad("product:42", load)),
      );
      assert.equal(loads, 1);
      for (const v of values) assert.deepEqual(v, { id: 42 });
      assert.equal(await admin.get(`${kind.name}:product:42`), '{"id":42}');
    });

    test("values, empty strings, null and negative entries stay apart", async () => {
      let loads = 0;
      const of = (value: unknown) => async () => {
        loads += 1;
        return value;
      };
      assert.equal(await cache.getOrLoad("empty", of("")), "");
      assert.equal(await cache.getOrLoad("null", of(null)), null);
      assert.equal(await cache.getOrLoad("missing", of(undefined)), undefined);
      assert.equal(loads, 3);
      // Hits now: the same answers, no loads.
      assert.equal(await cache.getOrLoad("empty", of("x")), "");
      assert.equal(await cache.getOrLoad("null", of("x")), null);
      assert.equal(await cache.getOrLoad("missing", of("x")), undefined);
      assert.equal(loads, 3);
      assert.ok((await admin.pttl(`${kind.name}:missing`)) > 0, "a negative entry expires");
    });

    test("a failing loader gives its lease to the next caller", async () => {
      await assert.rejects(
        cache.getOrLoad("flaky", async () => {
          throw new Error("database down");
        }),
        /database down/,
      );
      assert.equal(await cache.getOrLoad("flaky", async () => "up"), "up");
    });

    test("a waiter gets the value when the loader fails for another", async () => {
      let calls = 0;
      const load = async () => {
        calls += 1;
        await sleep(20);
        if (calls === 1) throw new Error("first load fails");
        return "second";
      };
      const results = await Promise.allSettled([
        cache.getOrLoad("retry", load),
        cache.getOrLoad("retry", load),
      ]);
      assert.deepEqual(
        results.map((r) => r.status),
        ["rejected", "fulfilled"],
      );
      assert.equal(calls, 2);
    });

    test("a wrapped function keys calls without collisions", async () => {
      const calls: unknown[][] = [];
      const describeIt = cache.wrap(
        async (id: unknown, options?: { full: boolean }) => {
          calls.push([id, options]);
          return `${typeof id}:${String(id)}:${options?.full ?? "-"}`;
        },
        { name: "describe" },
      );
      assert.equal(await describeIt(1), "number:1:-");
      assert.equal(await describeIt("1"), "string:1:-");
      assert.equal(await describeIt(null), "object:null:-");
      assert.equal(await describeIt(undefined), "undefined:undefined:-");
      assert.equal(await describeIt(1, { full: true }), "number:1:true");
      assert.equal(await describeIt(1), "number:1:-");
      assert.equal(calls.length, 5);
      assert.notEqual(describeIt.keyOf(1), describeIt.keyOf("1"));
      assert.equal(await describeIt.invalidate(1), true);
      assert.equal(await describeIt(1), "number:1:-");
      assert.equal(calls.length, 6);
    });

    test("an aborted wait for another caller's load leaves the queue", async () => {
      const key = "slow";
      const full = `${kind.name}:${key}`;
      let release: () => void = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      const loading = cache.getOrLoad(key, async () => {
        await gate;
        return "value";
      });
      await until(async () => (await cacheInfo(full, "lease")) !== null, "the lease");
      const abort = new AbortController();
      const waiting = cache.getOrLoad(key, async () => "other", { signal: abort.signal });
      await until(async () => (await cacheInfo(full, "waiters")) === 1, "the waiter");
      abort.abort();
      await assert.rejects(waiting, { name: "AbortError" });
      await until(async () => (await cacheInfo(full, "waiters")) === 0, "the waiter to leave");
      release();
      assert.equal(await loading, "value");
    });

    test("invalidate revokes a load in flight", async () => {
      let release: () => void = () => {};
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      const loading = cache.getOrLoad("race", async () => {
        await gate;
        return "old";
      });
      await sleep(20);
      await cache.invalidate("race");
      release();
      assert.equal(await loading, "old"); // its caller still gets what it loaded...
      assert.equal(await admin.get(`${kind.name}:race`), null); // ...but it is not stored
    });
  });
}
