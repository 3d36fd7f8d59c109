import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Redis } from "ioredis";
import { LockBusyError, LockLostError, Warden } from "warden-redis";
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

for (const kind of CLIENTS) {
  describe(`locks with ${kind.name}`, () => {
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

    test("50 concurrent tasks never overlap and see strictly rising fences", async () => {
      const key = `${kind.name}:fifty`;
      let inside = 0;
      const fences: bigint[] = [];
      await Promise.all(
        Array.from({ length: 50 }, async () => {
          await using lock = await warden.lock(key, { ttl: 10000 });
          inside += 1;
          assert.equal(inside, 1, "two holders at once");
          fences.push(lock.fence);
          await sleep(1);
          inside -= 1;
        }),
      );
      assert.equal(fences.length, 50);
      for (let i = 1; i < fences.length; i++) {
        assert.ok(fences[i] > fences[i - 1], `fence ${fences[i]} after ${fences[i - 1]}`);
      }
      assert.equal(typeof fences[0], "bigint");
      assert.equal(await info(admin, key), null);
    });

    test("a release whose connection breaks before it runs is sent again: the lock is free", async () => {
      const key = `${kind.name}:release-broken`;
      const clients = async () => String(await admin.call("CLIENT", "LIST")).split("\n");
      const others = new Set((await clients()).map((l) => /^id=(\d+)/.exec(l)?.[1]));
      const own = await kind.open(server);
      const w = new Warden(own.client);
      try {
        const lock = await w.lock(key, { ttl: 30000 });
        // The release waits behind the pause (a write); its connection is
        // closed before it runs (CLIENT KILL is no write).
        await admin.call("CLIENT", "PAUSE", "10000", "WRITE");
        try {
          const failed = assert.rejects(lock.release());
          const ids = await until(async () => {
            // This Warden's: a connection opened since, whose last command is warden's.
            const found = (await clients())
              .filter((l) => / cmd=lock\.(acquire|release) /.test(l))
              .map((l) => /^id=(\d+)/.exec(l)?.[1] ?? "")
              .filter((id) => id !== "" && !others.has(id));
            return found.length > 0 ? found : undefined;
          }, "warden's command connection");
          for (const id of ids ?? []) await admin.call("CLIENT", "KILL", "ID", id);
          await failed;
          assert.equal(lock.held, false);
          assert.equal(
            (await info(admin, key))?.owner,
            lock.owner,
            "the first release did not run",
          );
        } finally {
          await admin.call("CLIENT", "UNPAUSE");
        }
        await until(async () => (await info(admin, key)) === null, "the release sent again");
      } finally {
        await w.close();
        await own.close();
      }
    });

    test("a lock held through close() is released on a connection of its own", async () => {
      const key = `${kind.name}:release-after-close`;
      const own = await kind.open(server);
      const w = new Warden(own.client);
      try {
        const lock = await w.lock(key, { ttl: 30000 });
        await w.close();
        await lock.release();
        assert.equal(await info(admin, key), null);
      } finally {
        await own.close();
      }
    });

    test("an aborted wait leaves the queue", async () => {
      const key = `${kind.name}:abort-queued`;
      await admin.call("LOCK.ACQUIRE", key, "holder", 30000);
      const abort = new AbortController();
      const waiting = warden.lock(key, { ttl: 10000, signal: abort.signal });
      await until(async () => (await info(admin, key)).waiters === 1, "the waiter to queue");
      abort.abort();
      await assert.rejects(waiting, { name: "AbortError" });
      await until(async () => (await info(admin, key)).waiters === 0, "the waiter to leave");
      assert.equal((await info(admin, key)).owner, "holder");
      await admin.call("LOCK.RELEASE", key, "holder");
    });

    test("an aborted wait gives back a grant in flight", async () => {
      for (let round = 0; round < 20; round++) {
        const key = `${kind.name}:abort-granted:${round}`;
        await admin.call("LOCK.ACQUIRE", key, "holder", 30000);
        const abort = new AbortController();
        const outcome = warden.lock(key, { ttl: 30000, signal: abort.signal }).then(
          async (lock) => {
            await lock.release(); // granted before the abort: ours to release
            return "granted";
          },
          (error: Error) => error.name,
        );
        await until(async () => (await info(admin, key)).waiters === 1, "the waiter to queue");
        // The release hands the lock to the waiter while it aborts.
        const released = admin.call("LOCK.RELEASE", key, "holder");
        if (round % 2) await sleep(0);
        abort.abort();
        assert.equal(await released, 1);
        assert.ok(["granted", "AbortError"].includes(await outcome));
        // Free, never held by the aborted owner.
        await until(async () => (await info(admin, key)) === null, "the grant to be given back");
      }
    });

    test("a lock taken away from its watchdog reports lost", async () => {
      const key = `${kind.name}:lost`;
      const lock = await warden.lock(key, { ttl: 300, watchdog: true });
      assert.ok(!lock.lost.aborted);
      const lost = new Promise((resolve) => lock.lost.addEventListener("abort", resolve));
      await admin.del(key);
      await lost;
      assert.ok(lock.lost.reason instanceof LockLostError);
      assert.equal(lock.held, false);
      await assert.rejects(lock.release(), LockLostError);
    });

    test("the watchdog renews the lease until release", async () => {
      const key = `${kind.name}:watchdog`;
      // A 1 s lease, over more than two of them: a shorter one is lost
      // whenever a busy machine stalls the event loop past it.
      const short = new Warden(app.client, { watchdogLease: 1000 });
      try {
        const lock = await short.lock(key);
        await sleep(2500);
        assert.equal(lock.held, true);
        assert.equal((await info(admin, key)).owner, lock.owner);
        await lock.release();
        assert.equal(await info(admin, key), null);
      } finally {
        await short.close();
      }
    });

    test("a fixed lease reports lost when it ends", async () => {
      const lock = await warden.lock(`${kind.name}:lease-ends`, { ttl: 50 });
      await new Promise((resolve) => lock.lost.addEventListener("abort", resolve));
      assert.match(lock.lost.reason.message, /lease ended/);
    });

    test("extend resets the lease; a lost lock refuses it", async () => {
      const key = `${kind.name}:extend`;
      const lock = await warden.lock(key, { ttl: 1000 });
      await lock.extend(60000);
      assert.ok((await admin.pttl(key)) > 30000);
      await admin.del(key);
      await assert.rejects(lock.extend(), LockLostError);
    });

    test("tryLock answers null and lock() LockBusyError when busy", async () => {
      const key = `${kind.name}:busy`;
      const held = await warden.lock(key, { ttl: 10000 });
      assert.equal(await warden.tryLock(key, { ttl: 1000 }), null);
      await assert.rejects(warden.lock(key, { ttl: 1000, wait: 50 }), LockBusyError);
      await held.release();
      const next = await warden.tryLock(key, { ttl: 1000 });
      assert.ok(next);
      assert.ok(next.fence > held.fence);
      await next.release();
    });

    test("each acquire is a fresh owner", async () => {
      const key = `${kind.name}:owners`;
      const first = await warden.lock(key, { ttl: 10000 });
      assert.equal(await warden.tryLock(key, { ttl: 1000 }), null, "no re-entry");
      await first.release();
      const second = await warden.lock(key, { ttl: 10000 });
      assert.notEqual(second.owner, first.owner);
      await second.release();
    });

    test("using() runs the routine under the lock and releases it", async () => {
      const key = `${kind.name}:using`;
      const result = await warden.using(key, 1000, async (signal, lock) => {
        assert.equal(signal.aborted, false);
        assert.equal((await info(admin, key)).owner, lock.owner);
        return "done";
      });
      assert.equal(result, "done");
      assert.equal(await info(admin, key), null);
      await assert.rejects(
        warden.using(key, 1000, async () => {
          throw new Error("boom");
        }),
        /boom/,
      );
      assert.equal(await info(admin, key), null);
    });

    test("a full waiter pool still releases at once", async () => {
      const key = `${kind.name}:pool`;
      const small = new Warden(app.client, { maxWaiters: 3 });
      try {
        const holder = await small.lock(key, { ttl: 30000 });
        const order: number[] = [];
        const waiters = Array.from({ length: 6 }, (_, i) =>
          small.lock(key, { ttl: 30000 }).then(async (lock) => {
            order.push(i);
            await lock.release();
          }),
        );
        await until(async () => (await info(admin, key)).waiters === 3, "3 waiters in the server");
        await holder.release(); // needs no waiter connection
        await Promise.all(waiters);
        assert.equal(order.length, 6);
        assert.equal(await info(admin, key), null);
      } finally {
        await small.close();
      }
    });

    test("a wait does not hold up the application's client", async () => {
      const key = `${kind.name}:shared`;
      const holder = await warden.lock(key, { ttl: 30000 });
      const waiting = warden.lock(key, { ttl: 1000 });
      await until(async () => (await info(admin, key)).waiters === 1, "the waiter to queue");
      const pong = kind.name === "ioredis" ? app.client.ping() : app.client.sendCommand(["PING"]);
      assert.equal(await pong, "PONG");
      await holder.release();
      await (await waiting).release();
    });

    test("read locks share, the write lock excludes", async () => {
      const rw = warden.readWriteLock(`${kind.name}:rw`);
      const a = await rw.read({ ttl: 10000 });
      const b = await rw.read({ ttl: 10000 });
      assert.equal(await rw.tryWrite({ ttl: 1000 }), null);
      const writing = rw.write({ ttl: 10000 });
      await a.release();
      await b.release();
      const w = await writing;
      assert.ok(w.fence > b.fence);
      assert.equal(await rw.tryRead({ ttl: 1000 }), null);
      await w.release();
    });
  });
}

test("ioredis' commandTimeout does not cut a wait", async () => {
  const { Redis } = await import("ioredis");
  const app = new Redis({ path: server.socket, commandTimeout: 100 });
  const warden = new Warden(app);
  try {
    const holder = await warden.lock("timeout", { ttl: 30000 });
    const waiting = warden.lock("timeout", { ttl: 1000, wait: 5000 });
    await sleep(300);
    await holder.release();
    await (await waiting).release();
  } finally {
    await warden.close();
    app.disconnect();
  }
});

test("a node-redis client with a command timeout below the wait", async () => {
  const { createClient } = await import("redis");
  const app = createClient({
    socket: { path: server.socket, tls: false },
    commandOptions: { timeout: 100 },
  });
  app.on("error", () => {});
  await app.connect();
  const warden = new Warden(app);
  try {
    const holder = await warden.lock("node-redis-timeout", { ttl: 30000 });
    const waiting = warden.lock("node-redis-timeout", { ttl: 1000, wait: 5000 });
    await sleep(300);
    await holder.release();
    await (await waiting).release();
  } finally {
    await warden.close();
    app.destroy();
  }
});

test("the CommonJS build loads", async () => {
  const { createRequire } = await import("node:module");
  const require = createRequire(import.meta.url);
  const cjs = require("warden-redis");
  assert.equal(typeof cjs.Warden, "function");
  assert.equal(typeof cjs.LockBusyError, "function");
});
