// Edge cases of acquiring: close() during a wait's setup, a user without
// CLIENT, a stalled server, waits and leases past Node's timer limit, a new
// Warden's command connection.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Redis } from "ioredis";
import { createClient } from "redis";
import { ConnectionError, LockBusyError, Warden } from "warden-redis";
import { type AppClient, CLIENTS, Server, info, sleep, until } from "./servers.js";

let server: Server;
let admin: Redis;
before(async () => {
  server = await Server.start();
  admin = server.admin();
  await admin.call("ACL", "SETUSER", "noclient", "on", ">pw", "~*", "&*", "+@all", "-client");
});
after(async () => {
  admin?.disconnect();
  await server?.stop();
});

const clients = async (s: Redis = admin) =>
  Number(/connected_clients:(\d+)/.exec(await s.info("clients"))?.[1] ?? Number.NaN);

const semWaiters = async (s: Redis, key: string) =>
  Number((await info(s, key, "SEM.INFO"))?.waiters ?? 0);

for (const kind of CLIENTS.filter((c) => c.name === "ioredis" || c.name === "node-redis")) {
  describe(`acquire edge cases with ${kind.name}`, () => {
    let app: AppClient;
    before(async () => {
      app = await kind.open(server);
      await app.client.ping();
    });
    after(async () => {
      await app?.close();
    });

    test("close() while a waiter connection opens: the acquire rejects, nothing waits or is granted", async () => {
      // Each delay closes at another point of the wait's setup.
      for (const delay of [0, 1, 2, 3, 4, 6, 8, 12]) {
        const key = `${kind.name}:close:${delay}`;
        await admin.call("SEM.ACQUIRE", key, "holder", "60000", "LIMIT", "1");
        const warden = new Warden(app.client);
        const outcome = warden
          .semaphore(key, 1)
          .acquire({ ttl: 60000 })
          .then(
            () => "granted",
            (e) => e,
          );
        await sleep(delay);
        await warden.close();
        const settled = await Promise.race([outcome, sleep(2000).then(() => "pending")]);
        assert.ok(settled instanceof ConnectionError, `delay ${delay}: ${settled}`);
        await until(async () => (await semWaiters(admin, key)) === 0, `delay ${delay}: no waiter`);
        await admin.call("SEM.RELEASE", key, "holder");
        await sleep(20);
        assert.equal(await info(admin, key, "SEM.INFO"), null, `delay ${delay}: nothing held`);
      }
    });

    test("an abort whose grant arrives during WITHDRAW cuts off no other caller's wait", async () => {
      // One waiter connection: B waits for it while A waits on it, and H2
      // queues behind A. A's abort and the holder's release cross: A's grant
      // arrives while WITHDRAW is on its way (it answers 0), the connection
      // goes back to the pool and carries B's wait. The abort must not then
      // unblock or close it: B keeps waiting.
      const warden = new Warden(app.client, { maxWaiters: 1 });
      const other = server.admin();
      try {
        for (let round = 0; round < 20; round++) {
          const key = `${kind.name}:crossed:${round}`;
          await admin.call("LOCK.ACQUIRE", key, "H", "10000");
          const abort = new AbortController();
          const a = warden
            .lock(key, { ttl: 10000, wait: 5000, signal: abort.signal })
            .catch(() => null);
          await sleep(5);
          const h2 = other.call("LOCK.ACQUIRE", key, "H2", "10000", "WAIT", "3000");
          await sleep(5);
          const b = warden.lock(key, { ttl: 10000, wait: 3000 }).then(
            () => "granted",
            (e: Error) => e.name,
          );
          await sleep(5);
          abort.abort();
          void admin.call("LOCK.RELEASE", key, "H");
          await h2;
          const outcome = await Promise.race([b, sleep(300).then(() => "still waiting")]);
          assert.ok(
            outcome === "still waiting" || outcome === "granted",
            `round ${round}: B ${outcome}`,
          );
          await admin.call("LOCK.RELEASE", key, "H2");
          const lock = await b;
          assert.equal(lock, "granted", `round ${round}: B granted once H2 let go`);
          await a;
          await admin.call("DEL", key);
        }
      } finally {
        other.disconnect();
        await warden.close();
      }
    });

    test("a stalled server: the caller is answered by its deadline, a late grant is given back", async () => {
      for (const held of [false, true]) {
        const key = `${kind.name}:stall:${held}`;
        const warden = new Warden(app.client);
        const sem = warden.semaphore(key, 1);
        await (await sem.acquire({ ttl: 1000 })).release(); // the command connection is open
        if (held) await admin.call("SEM.ACQUIRE", key, "holder", "60000", "LIMIT", "1");
        // A pause far longer than the wait (the UNPAUSE after it waits for
        // its end too: it pauses every client).
        await admin.call("CLIENT", "PAUSE", "4000", "ALL");
        const t0 = performance.now();
        const outcome = await sem.acquire({ ttl: 60000, wait: 100 }).catch((e) => e);
        const took = performance.now() - t0;
        assert.ok(outcome instanceof LockBusyError, `held ${held}: ${outcome}`);
        // Generous slack: only "not at the pause's end" is checked.
        assert.ok(took < 3000, `held ${held}: answered after ${took} ms`);
        await admin.call("CLIENT", "UNPAUSE");
        if (held) await admin.call("SEM.RELEASE", key, "holder");
        await until(async () => (await info(admin, key, "SEM.INFO")) === null, "nothing held");
        await warden.close();
      }
    });

    test("a wait or lease past 2^31 ms keeps its time", async () => {
      const key = `${kind.name}:long`;
      const warden = new Warden(app.client);
      for (const wait of [2 ** 31, 3e9, 1e20]) {
        await admin.call("LOCK.ACQUIRE", key, "holder", "60000");
        const release = sleep(100).then(() => admin.call("LOCK.RELEASE", key, "holder"));
        const lock = await warden.lock(key, { ttl: 10000, wait }).catch((e) => e);
        await release;
        assert.ok(!(lock instanceof Error), `wait ${wait}: ${lock}`);
        await lock.release();
      }
      const lock = await warden.lock(key, { ttl: 2 ** 31 + 1000, watchdog: false });
      await sleep(50);
      assert.ok(lock.held, "a lease past 2^31 ms is not lost at once");
      await lock.release();
      await warden.close();
    });

    test("a new Warden opens its command connection before the first acquire", async () => {
      // Earlier tests' closed connections are gone from the count first.
      let before = -1;
      await until(async () => {
        const [a] = [await clients(), await sleep(100)];
        const settled = a === (await clients());
        before = a;
        return settled;
      }, "the connection count to settle");
      const warden = new Warden(app.client);
      await until(async () => (await clients()) === before + 1, "the command connection");
      await warden.close();
      await until(async () => (await clients()) === before, "it to close");
    });
  });
}

// A user whose ACL refuses CLIENT, and a server where CLIENT is renamed away:
// waits work, an abort sends WARDEN.WITHDRAW; a user refused that too: an
// abort closes the waiter connection.
const NO_CLIENT: { name: string; extra: string[]; user?: string; deny?: string[] }[] = [
  { name: "ACL -client", extra: [], user: "noclient", deny: ["-client"] },
  {
    name: "ACL -client -warden.withdraw",
    extra: [],
    user: "nowithdraw",
    deny: ["-client", "-warden.withdraw"],
  },
  { name: "rename-command CLIENT", extra: ["--rename-command", "CLIENT", '""'] },
];
const OPEN: Record<string, (s: Server, user?: string) => Promise<AppClient>> = {
  ioredis: async (s, user) => {
    const r = new Redis({ path: s.socket, ...(user ? { username: user, password: "pw" } : {}) });
    r.on("error", () => {});
    return { client: r, close: async () => r.disconnect() };
  },
  "node-redis": async (s, user) => {
    const c = createClient({
      socket: { path: s.socket, tls: false },
      ...(user ? { username: user, password: "pw" } : {}),
    });
    c.on("error", () => {});
    await c.connect();
    return { client: c, close: async () => c.destroy() };
  },
};

for (const c of NO_CLIENT) {
  for (const [name, open] of Object.entries(OPEN)) {
    test(`without CLIENT (${c.name}, ${name}): a wait is granted, an abort leaves nothing`, async () => {
      const own = c.extra.length > 0 ? await Server.start(c.extra) : server;
      const check = own === server ? admin : own.admin();
      if (c.user) {
        await check.call(
          "ACL",
          "SETUSER",
          c.user,
          "on",
          ">pw",
          "~*",
          "&*",
          "+@all",
          ...(c.deny ?? []),
        );
      }
      const app = await open(own, c.user);
      const warden = new Warden(app.client);
      const key = `noclient:${c.name}:${name}`;
      try {
        await check.call("SEM.ACQUIRE", key, "holder", "60000", "LIMIT", "1");
        const waiting = warden.semaphore(key, 1).acquire({ ttl: 60000, wait: 5000 });
        await until(async () => (await semWaiters(check, key)) === 1, "a waiter");
        await check.call("SEM.RELEASE", key, "holder");
        await (await waiting).release();

        await check.call("SEM.ACQUIRE", key, "holder", "60000", "LIMIT", "1");
        const abort = new AbortController();
        const aborted = warden
          .semaphore(key, 1)
          .acquire({ ttl: 60000, signal: abort.signal })
          .catch((e) => e);
        await until(async () => (await semWaiters(check, key)) === 1, "a waiter");
        abort.abort();
        assert.equal((await aborted)?.name, "AbortError");
        await until(async () => (await semWaiters(check, key)) === 0, "the waiter gone");
        await check.call("SEM.RELEASE", key, "holder");
        await sleep(20);
        assert.equal(await info(check, key, "SEM.INFO"), null);
      } finally {
        await warden.close();
        await app.close();
        if (own !== server) {
          check.disconnect();
          await own.stop();
        }
      }
    });
  }
}

describe("careless arguments are refused before anything is sent", () => {
  let app: Redis;
  let warden: Warden;
  before(async () => {
    app = new Redis({ path: server.socket });
    warden = new Warden(app);
  });
  after(async () => {
    await warden?.close();
    app?.disconnect();
  });

  // The calls of warden's commands so far (INFO commandstats).
  const sent = async () => {
    const stats = await admin.info("commandstats");
    return [...stats.matchAll(/^cmdstat_(lock|rwlock|sem|rate|cache)\.[a-z]+:calls=(\d+)/gm)]
      .map((m) => Number(m[2]))
      .reduce((a, b) => a + b, 0);
  };
  // biome-ignore lint/suspicious/noExplicitAny: careless JavaScript callers, past the types
  const loose = (value: unknown): any => value;

  const keys: [string, unknown][] = [
    ["undefined", undefined],
    ["null", null],
    ["an object", {}],
    ["a number", 1],
    ["an array", ["k"]],
  ];
  const calls: [string, (key: unknown) => Promise<unknown>][] = [
    ["lock", (key) => warden.lock(loose(key), { ttl: 1000 })],
    ["tryLock", (key) => warden.tryLock(loose(key), { ttl: 1000 })],
    ["using", (key) => warden.using(loose(key), 1000, async () => 1)],
    ["readWriteLock().write", async (key) => warden.readWriteLock(loose(key)).write({ ttl: 1000 })],
    ["semaphore().acquire", async (key) => warden.semaphore(loose(key), 2).acquire({ ttl: 1000 })],
    [
      "rateLimiter().tryAcquire",
      async (key) => warden.rateLimiter(loose(key), { count: 5, period: 1000 }).tryAcquire(),
    ],
    ["cache().getOrLoad", (key) => warden.cache().getOrLoad(loose(key), () => 1)],
    ["cache().invalidate", (key) => warden.cache().invalidate(loose(key))],
    ["cache({ prefix })", async (key) => warden.cache({ prefix: loose(key) })],
  ];
  for (const [what, key] of keys) {
    for (const [name, call] of calls) {
      // An undefined or null prefix is the default one ("").
      if (name === "cache({ prefix })" && (key === undefined || key === null)) continue;
      test(
        `${name} with a key that is ${what}: TypeError, nothing sent`,
        { timeout: 5000 },
        async () => {
          const before = await sent();
          await assert.rejects(
            call(key),
            (e: unknown) => e instanceof TypeError && /must be a string/.test(String(e)),
          );
          assert.equal(await sent(), before);
          assert.equal(await admin.exists(String(key)), 0);
        },
      );
    }
  }

  const options: [string, Record<string, unknown>][] = [
    ['watchdog: "no"', { watchdog: "no" }],
    ["watchdog: 1", { watchdog: 1 }],
    ["signal: {}", { signal: {} }],
    ['signal: "stop"', { signal: "stop" }],
    ["signal: null", { signal: null }],
  ];
  for (const [what, opts] of options) {
    const acquires: [string, () => Promise<unknown>][] = [
      ["lock", () => warden.lock("careless", loose({ ttl: 1000, ...opts }))],
      [
        "readWriteLock().read",
        () => warden.readWriteLock("careless-rw").read(loose({ ttl: 1000, ...opts })),
      ],
      [
        "semaphore().acquire",
        () => warden.semaphore("careless-sem", 2).acquire(loose({ ttl: 1000, ...opts })),
      ],
    ];
    if (what.startsWith("signal")) {
      acquires.push(
        [
          "rateLimiter().acquire",
          () =>
            warden.rateLimiter("careless-rate", { count: 5, period: 1000 }).acquire(1, loose(opts)),
        ],
        [
          "cache().getOrLoad",
          () => warden.cache().getOrLoad("careless-cache", () => 1, loose(opts)),
        ],
      );
    }
    for (const [name, call] of acquires) {
      test(`${name} with ${what}: TypeError, nothing sent`, { timeout: 5000 }, async () => {
        const before = await sent();
        await assert.rejects(call(), TypeError);
        assert.equal(await sent(), before);
        assert.equal(
          await admin.exists(
            "careless",
            "careless-rw",
            "careless-sem",
            "careless-rate",
            "careless-cache",
          ),
          0,
        );
      });
    }
  }
});
