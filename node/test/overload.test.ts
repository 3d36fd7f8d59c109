// The client's side of deadlines and overload: a try on the shared connection
// first, the caller's deadline as the server's WAIT, no in-process queue past
// it, aborts that leave nothing behind, load shedding, clear errors.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import type { Redis } from "ioredis";
import { ConnectionError, LockBusyError, ReplyError, Warden } from "warden-redis";
import { type AppClient, CLIENTS, Server, info, sleep, until } from "./servers.js";

let server: Server;
let admin: Redis;
let queues = false;
before(async () => {
  server = await Server.start();
  admin = server.admin();
  // A module without QUEUE answers a syntax error.
  queues = await admin.call("LOCK.ACQUIRE", "probe:queue", "o", "1", "QUEUE", "1").then(
    () => true,
    () => false,
  );
});
after(async () => {
  admin?.disconnect();
  await server?.stop();
});

const clients = async () =>
  Number(/connected_clients:(\d+)/.exec(await admin.info("clients"))?.[1] ?? Number.NaN);

/** Resolves when `key`'s LOCK.INFO (or `command`) shows `n` waiters. */
const waiters = (key: string, n: number, command = "LOCK.INFO") =>
  until(
    async () => Number((await info(admin, key, command))?.waiters) === n,
    `${n} waiters on ${key}`,
  );

for (const kind of CLIENTS.filter((c) => c.name === "ioredis" || c.name === "node-redis")) {
  describe(`overload with ${kind.name}`, () => {
    let app: AppClient;
    before(async () => {
      app = await kind.open(server);
      await app.client.ping(); // connected before any count of connections
    });
    after(async () => {
      await app?.close();
    });

    test("a free lock, semaphore or read lock is granted without a waiter connection", async () => {
      const cases: [string, (w: Warden, key: string) => Promise<{ release(): Promise<void> }>][] = [
        ["lock", (w, key) => w.lock(key, { ttl: 10000, wait: 1000 })],
        ["semaphore", (w, key) => w.semaphore(key, 2).acquire({ ttl: 10000, wait: 1000 })],
        ["read lock", (w, key) => w.readWriteLock(key).read({ ttl: 10000, wait: 1000 })],
        ["write lock", (w, key) => w.readWriteLock(key).write({ ttl: 10000 })],
      ];
      for (const [name, take] of cases) {
        const before = await clients();
        const warden = new Warden(app.client);
        const held = await take(warden, `${kind.name}:fast:${name}`);
        await held.release();
        // One connection: the shared one that took and released it.
        assert.equal((await clients()) - before, 1, name);
        await warden.close();
        await until(async () => (await clients()) === before, "warden's connection to close");
      }
    });

    test("a wait for a waiter connection ends at its deadline, and the WAIT sent is what remains", async () => {
      const key = `${kind.name}:remaining`;
      await admin.call("LOCK.ACQUIRE", key, "holder", "10000");
      const warden = new Warden(app.client, { maxWaiters: 1 });
      const monitor = await admin.monitor();
      const sent: number[] = [];
      monitor.on("monitor", (_time: string, args: string[]) => {
        if (args[0]?.toUpperCase() === "LOCK.ACQUIRE" && args[1] === key) {
          const i = args.findIndex((a) => a.toUpperCase() === "WAIT");
          if (i > 0) sent.push(Number(args[i + 1]));
        }
      });
      try {
        const order: string[] = [];
        // `first` takes the one waiter connection; `short` waits for it and
        // gives up at its own deadline, long before `first` is answered.
        const first = warden.lock(key, { wait: 1500 }).catch((e) => {
          order.push("first");
          return e;
        });
        await waiters(key, 1);
        const short = warden.lock(key, { wait: 100 }).catch((e) => {
          order.push("short");
          return e;
        });
        assert.ok((await short) instanceof LockBusyError);
        // `later` gets the connection once `first` times out: its WAIT is
        // what remains of its 2500 ms, not 2500.
        const later = warden.lock(key, { wait: 2500 }).catch((e) => e);
        assert.ok((await first) instanceof LockBusyError);
        assert.ok((await later) instanceof LockBusyError);
        assert.deepEqual(order, ["short", "first"]);
        assert.equal(sent.length, 2, `WAITs sent: ${sent}`);
        assert.ok(sent[0] >= 1400 && sent[0] < 1500, `first WAIT ${sent[0]}`);
        assert.ok(sent[1] >= 1 && sent[1] < 2500 - 500, `later WAIT ${sent[1]}`);
      } finally {
        monitor.disconnect();
        await warden.close();
        await admin.call("LOCK.RELEASE", key, "holder");
      }
    });

    test("no grant reaches a caller after its deadline", async () => {
      const key = `${kind.name}:deadline`;
      const warden = new Warden(app.client, { maxWaiters: 4 });
      const sem = warden.semaphore(key, 1);
      let late = 0;
      let granted = 0;
      await Promise.all(
        Array.from({ length: 40 }, async () => {
          const t0 = performance.now();
          let permit: Awaited<ReturnType<typeof sem.acquire>>;
          try {
            // Long enough that a busy machine's first round trip is within it.
            permit = await sem.acquire({ ttl: 10000, wait: 100 });
          } catch (error) {
            assert.ok(error instanceof LockBusyError, String(error));
            return;
          }
          granted++;
          // Generous slack: the test's clock starts before the call's.
          if (performance.now() - t0 > 100 + 25) late++;
          await sleep(5);
          await permit.release();
        }),
      );
      await warden.close();
      assert.ok(granted > 0);
      assert.equal(late, 0, `${late} of ${granted} grants came after the deadline`);
      // A grant that came too late is given back without delaying its caller.
      await until(async () => (await info(admin, key, "SEM.INFO")) === null, "nothing held");
    });

    test("an aborted wait leaves no grant and no waiter, also when the grant races the abort", async () => {
      const cases: {
        name: string;
        race: boolean;
        command: string;
        take: (w: Warden, key: string, s: AbortSignal) => Promise<unknown>;
      }[] = [
        {
          name: "lock",
          race: false,
          command: "LOCK",
          take: (w, key, signal) => w.lock(key, { ttl: 10000, signal }),
        },
        {
          name: "lock, grant racing",
          race: true,
          command: "LOCK",
          take: (w, key, signal) => w.lock(key, { ttl: 10000, signal }),
        },
        {
          name: "semaphore, grant racing",
          race: true,
          command: "SEM",
          take: (w, key, signal) => w.semaphore(key, 1).acquire({ ttl: 10000, wait: 5000, signal }),
        },
      ];
      for (const c of cases) {
        const key = `${kind.name}:abort:${c.name}`;
        const acquire =
          c.command === "SEM"
            ? ["SEM.ACQUIRE", key, "holder", "10000", "LIMIT", "1"]
            : ["LOCK.ACQUIRE", key, "holder", "10000"];
        const infoCommand = `${c.command}.INFO`;
        await admin.call(acquire[0], ...acquire.slice(1));
        const warden = new Warden(app.client);
        const abort = new AbortController();
        const waiting = c.take(warden, key, abort.signal).then(
          () => "granted",
          (e) => e,
        );
        await waiters(key, 1, infoCommand);
        const open = await clients();
        if (c.race) {
          // The release hands the lock to the waiter while the abort is on its way.
          const released = admin.call(`${c.command}.RELEASE`, key, "holder");
          abort.abort();
          await released;
        } else {
          abort.abort();
        }
        const outcome = await waiting;
        assert.equal((outcome as Error)?.name, "AbortError", `${c.name}: ${outcome}`);
        if (!c.race) {
          await waiters(key, 0, infoCommand);
          await admin.call(`${c.command}.RELEASE`, key, "holder");
        }
        await until(
          async () => (await info(admin, key, infoCommand)) === null,
          `${c.name}: nothing held`,
        );
        if (!c.race) {
          // WARDEN.WITHDRAW took the waiter out on every server (CLIENT
          // UNBLOCK cannot on Redis 7.0-7.2): its connection stays open.
          assert.equal(await clients(), open, `${c.name}: the waiter connection kept`);
          assert.ok(
            (await admin.info("commandstats")).includes("cmdstat_warden.withdraw:calls="),
            `${c.name}: WARDEN.WITHDRAW sent`,
          );
        }
        await warden.close();
      }
    });

    test("an abort is over on the server before it is reported: a release next grants nobody", async () => {
      // The holder is released on the application's client, another
      // connection than the aborted waiter's: the server must have dropped
      // the waiter by then (nothing held after the release), also where the
      // abort closes the waiter's connection (Redis 7.0-7.2).
      const send = (...args: string[]): Promise<unknown> =>
        kind.name === "ioredis" ? app.client.call(...args) : app.client.sendCommand(args);
      const cases: {
        command: string;
        hold: string[];
        wait: (w: Warden, key: string, signal: AbortSignal) => Promise<unknown>;
      }[] = [
        {
          command: "LOCK",
          hold: ["LOCK.ACQUIRE", "holder", "10000"],
          wait: (w, key, signal) => w.lock(key, { ttl: 10000, signal }),
        },
        {
          command: "SEM",
          hold: ["SEM.ACQUIRE", "holder", "10000", "LIMIT", "1"],
          wait: (w, key, signal) => w.semaphore(key, 1).acquire({ ttl: 10000, wait: 5000, signal }),
        },
      ];
      const warden = new Warden(app.client);
      try {
        for (const c of cases) {
          for (let i = 0; i < 20; i++) {
            const key = `${kind.name}:abort-ordered:${c.command}:${i}`;
            await send(c.hold[0], key, ...c.hold.slice(1));
            const abort = new AbortController();
            const waiting = c.wait(warden, key, abort.signal).catch((e) => e);
            await waiters(key, 1, `${c.command}.INFO`);
            abort.abort();
            assert.equal(((await waiting) as Error)?.name, "AbortError");
            await send(`${c.command}.RELEASE`, key, "holder");
            assert.equal(await info(admin, key, `${c.command}.INFO`), null, `${key}: held`);
          }
        }
      } finally {
        await warden.close();
      }
    });

    test("maxQueue sheds a request at once when that many wait", async (t) => {
      if (!queues) {
        t.skip("this module has no QUEUE");
        return;
      }
      const key = `${kind.name}:shed`;
      await admin.call("LOCK.ACQUIRE", key, "holder", "10000");
      const warden = new Warden(app.client);
      try {
        const first = warden.lock(key, { wait: 5000 }).catch((e) => e);
        await waiters(key, 1);
        const order: string[] = [];
        const shed = warden.lock(key, { wait: 5000, maxQueue: 1 }).catch((e) => {
          order.push("shed");
          return e;
        });
        assert.ok((await shed) instanceof LockBusyError);
        assert.equal(Number((await info(admin, key)).waiters), 1);
        await admin.call("LOCK.RELEASE", key, "holder");
        const lock = await first;
        order.push("first");
        assert.deepEqual(order, ["shed", "first"]);
        await lock.release();
        await assert.rejects(warden.lock(key, { maxQueue: -1 }), RangeError);
      } finally {
        await warden.close();
      }
    });

    test("300 concurrent waiters with the default options: no error", async () => {
      const key = `${kind.name}:300`;
      const warden = new Warden(app.client);
      const sem = warden.semaphore(key, 3);
      const outcomes = await Promise.all(
        Array.from({ length: 300 }, async (_, i) => {
          try {
            // Half give up quickly, half wait until granted.
            const permit = await sem.acquire({ ttl: 10000, wait: i % 2 ? 20 : 60000 });
            await sleep(1);
            await permit.release();
            return "granted";
          } catch (error) {
            if (error instanceof LockBusyError) return "busy";
            return String(error);
          }
        }),
      );
      await warden.close();
      const errors = outcomes.filter((o) => o !== "granted" && o !== "busy");
      assert.deepEqual(errors, []);
      assert.equal(outcomes.filter((o, i) => i % 2 === 0 && o === "granted").length, 150);
      assert.equal(await info(admin, key, "SEM.INFO"), null);
    });

    test("WRONGTYPE stays WRONGTYPE, on the try and on the wait", async () => {
      const key = `${kind.name}:wrongtype`;
      await admin.set(key, "a string");
      const warden = new Warden(app.client);
      for (const take of [
        () => warden.lock(key, { wait: 100 }),
        () => warden.semaphore(key, 2).acquire({ wait: 100 }),
        () => warden.readWriteLock(key).read({ wait: 100 }),
      ]) {
        await assert.rejects(
          take(),
          (e: unknown) => e instanceof ReplyError && /^WRONGTYPE/.test(e.message),
        );
      }
      await warden.close();
    });

    test("close() racing busy acquires leaves held only what callers hold", async () => {
      for (let round = 0; round < 6; round++) {
        const key = `${kind.name}:close-race:${round}`;
        const warden = new Warden(app.client);
        const sem = warden.semaphore(key, 3);
        let closed = false;
        let held = 0; // permits callers hold and could not release after close()
        const errors: string[] = [];
        const worker = async (i: number) => {
          while (!closed) {
            const options =
              i % 3 === 0
                ? { ttl: 60000, wait: 30 }
                : i % 3 === 1
                  ? { ttl: 60000, signal: AbortSignal.timeout(20 + (i % 20)) }
                  : { ttl: 60000 };
            let permit: Awaited<ReturnType<typeof sem.acquire>>;
            try {
              permit = await sem.acquire(options);
            } catch (error) {
              const e = error as Error;
              const expected =
                e instanceof LockBusyError ||
                e.name === "TimeoutError" ||
                (e instanceof ConnectionError && e.message === "warden is closed");
              if (!expected) errors.push(`${e.name}: ${e.message}`);
              continue;
            }
            await sleep(Math.random() * 3);
            await permit.release().catch(() => held++);
          }
        };
        const all = Array.from({ length: 45 }, (_, i) => worker(i));
        await sleep(5 + Math.random() * 60);
        closed = true;
        await warden.close();
        await Promise.all(all);
        assert.deepEqual(errors, []);
        // Give-backs end before close() returns: nothing is left for later.
        const state = await info(admin, key, "SEM.INFO");
        assert.equal(Number(state?.holders ?? 0), held, `round ${round}: ${JSON.stringify(state)}`);
        assert.equal(Number(state?.waiters ?? 0), 0);
        if (state !== null) await admin.del(key);
      }
    });

    test("after close() every acquire rejects with warden's own error", async () => {
      const key = `${kind.name}:closed`;
      const warden = new Warden(app.client);
      const sem = warden.semaphore(key, 100);
      (await sem.acquire({ ttl: 1000 })).release();
      const takes = [
        () => sem.tryAcquire({ ttl: 60000 }),
        () => sem.acquire({ ttl: 60000 }),
        () => sem.acquire({ ttl: 60000, wait: 1000 }),
        () => sem.acquire({ ttl: 60000, signal: AbortSignal.timeout(1000) }),
        () => warden.lock(`${key}:lock`, { ttl: 60000, wait: 1000 }),
        () => warden.readWriteLock(`${key}:rw`).read({ ttl: 60000 }),
      ];
      // Started in the same turn as close(), and after it returned.
      const outcome = () =>
        takes.map((take) =>
          take().then(
            () => "granted",
            (e: Error) => (e instanceof ConnectionError ? e.message : `${e.name}: ${e.message}`),
          ),
        );
      const closing = warden.close();
      const during = outcome();
      await closing;
      const afterwards = outcome();
      for (const got of await Promise.all([...during, ...afterwards])) {
        assert.equal(got, "warden is closed");
      }
      assert.equal(await info(admin, key, "SEM.INFO"), null);
      assert.equal(await info(admin, `${key}:lock`), null);
    });

    test("many acquires sharing one AbortSignal add one listener to it", async () => {
      const key = `${kind.name}:shared-signal`;
      await admin.call("SEM.ACQUIRE", key, "other", "60000", "LIMIT", "1");
      const warnings: string[] = [];
      const onWarning = (w: Error) => warnings.push(w.name);
      process.on("warning", onWarning);
      const warden = new Warden(app.client);
      const sem = warden.semaphore(key, 1);
      const controller = new AbortController();
      const all = Array.from({ length: 40 }, () =>
        sem.acquire({ ttl: 60000, signal: controller.signal }).then(
          () => "granted",
          (e: Error) => e.name,
        ),
      );
      await until(
        async () => Number((await info(admin, key, "SEM.INFO"))?.waiters) === 40,
        "40 waiters",
      );
      controller.abort();
      assert.deepEqual(new Set(await Promise.all(all)), new Set(["AbortError"]));
      await sleep(20);
      process.off("warning", onWarning);
      assert.deepEqual(warnings, []);
      await warden.close();
      await admin.call("SEM.RELEASE", key, "other");
    });

    test("a burst's grants are checked against the deadline after each hold is made", async () => {
      const key = `${kind.name}:burst-deadline`;
      const n = 150;
      const wait = 100;
      const warden = new Warden(app.client);
      const sem = warden.semaphore(key, n);
      (await sem.acquire({ ttl: 1000 })).release(); // connection open, semaphore known
      // Each hold made costs 1 ms (its lease timer): the burst's grants reach
      // the client in time, and the holds are ready only past the deadline.
      const setTimer = globalThis.setTimeout;
      const slow = ((...args: Parameters<typeof setTimeout>) => {
        if (/\.schedule /.test(new Error().stack ?? "")) {
          const end = performance.now() + 1;
          while (performance.now() < end) {}
        }
        return setTimer(...args);
      }) as typeof setTimeout;
      globalThis.setTimeout = slow;
      let late = 0;
      let granted = 0;
      try {
        await Promise.all(
          Array.from({ length: n }, async () => {
            const start = performance.now();
            try {
              await sem.acquire({ ttl: 60000, watchdog: false, wait });
            } catch (error) {
              if (error instanceof LockBusyError) return;
              throw error;
            }
            granted++;
            if (performance.now() - start > wait) late++;
          }),
        );
      } finally {
        globalThis.setTimeout = setTimer;
      }
      assert.equal(late, 0, `${late} of ${granted} grants reached their caller past the deadline`);
      await warden.close();
      const state = await info(admin, key, "SEM.INFO");
      assert.equal(Number(state?.holders ?? 0), granted);
      await admin.del(key);
    });
  });
}
