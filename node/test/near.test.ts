import assert from "node:assert/strict";
import { type ChildProcess, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { type AddressInfo, createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { Redis } from "ioredis";
import { type Cache, type NearCache, Warden } from "warden-redis";
import { type AppClient, CLIENTS, SERVER, Server, sleep, until } from "./servers.js";

/** `calls` of each command in `INFO commandstats`. */
async function calls(admin: Redis, ...commands: string[]): Promise<number[]> {
  const text = await admin.info("commandstats");
  return commands.map((command) => {
    const m = new RegExp(`^cmdstat_${command.replace(".", "\\.")}:calls=(\\d+)`, "m").exec(text);
    return m === null ? 0 : Number(m[1]);
  });
}

/** The ids of the server's connections with CLIENT TRACKING on. */
async function tracking(admin: Redis): Promise<string[]> {
  const list = String(await admin.call("CLIENT", "LIST"));
  return list
    .split("\n")
    .filter((line) => /\bflags=\S*t/.test(line))
    .map((line) => /\bid=(\d+)/.exec(line)?.[1] ?? "");
}

/** A read through the cache whose loader answers "loaded". */
const read = (cache: Cache, key: string) => cache.getOrLoad(key, async () => "loaded");

/** Reads `key` until it is held here (a peek after a load keeps it). */
async function hold(cache: Cache, key: string): Promise<unknown> {
  const near = cache.near as NearCache;
  await cache.sync(); // the setup's write, applied
  await read(cache, key);
  await read(cache, key);
  const hits = near.stats().hits;
  const value = await read(cache, key);
  assert.equal(near.stats().hits, hits + 1, `${key} is held`);
  return value;
}

const KINDS = CLIENTS.filter((k) => k.name === "ioredis" || k.name === "node-redis");

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

for (const kind of KINDS) {
  describe(`near cache with ${kind.name}`, () => {
    let app: AppClient;
    let warden: Warden;
    let cache: Cache;
    let near: NearCache;
    const p = `near:${kind.name}:`;
    before(async () => {
      app = await kind.open(server);
      warden = new Warden(app.client, { maxWaiters: 8 });
      cache = warden.cache({ prefix: p, ttl: 60000, near: true });
      near = cache.near as NearCache;
      await near.ready();
    });
    after(async () => {
      await warden?.close();
      await app?.close();
    });

    test("a hit takes no round trip", async () => {
      await admin.set(`${p}hit`, '"v"');
      assert.equal(await hold(cache, "hit"), "v");
      const before = await calls(admin, "cache.peek", "cache.get");
      const hits = near.stats().hits;
      for (let i = 0; i < 1000; i++) assert.equal(await read(cache, "hit"), "v");
      assert.deepEqual(await calls(admin, "cache.peek", "cache.get"), before);
      assert.equal(near.stats().hits, hits + 1000);
    });

    const writes: [string, (key: string) => Promise<unknown>, unknown][] = [
      ["SET", (key) => admin.set(key, '"v2"'), "v2"],
      ["DEL", (key) => admin.del(key), "loaded"],
      ["CACHE.INVALIDATE", (key) => admin.call("CACHE.INVALIDATE", key), "loaded"],
      ["FLUSHALL", () => admin.flushall(), "loaded"],
    ];
    for (const [name, write, after] of writes) {
      test(`${name} drops the held value`, async () => {
        await admin.set(`${p}w`, '"v1"');
        assert.equal(await hold(cache, "w"), "v1");
        const { invalidations, flushes } = near.stats();
        await write(`${p}w`);
        await cache.sync();
        if (name === "FLUSHALL") assert.equal(near.stats().flushes, flushes + 1);
        else assert.ok(near.stats().invalidations > invalidations);
        const hits = near.stats().hits;
        assert.equal(await read(cache, "w"), after);
        assert.equal(near.stats().hits, hits);
      });
    }

    test("a key with a lone surrogate is never kept (its invalidation would name U+FFFD)", async () => {
      const key = "lone\uD800";
      await admin.set(`${p}${key}`, '"v1"');
      assert.equal(await read(cache, key), "v1");
      assert.equal(await read(cache, key), "v1");
      await admin.set(`${p}${key}`, '"v2"');
      await cache.sync();
      assert.equal(await read(cache, key), "v2");
    });

    test("an expired value is not served", async () => {
      await admin.set(`${p}exp`, '"short"', "PX", 300);
      assert.equal(await hold(cache, "exp"), "short");
      await until(async () => (await read(cache, "exp")) === "loaded", "the value to expire");
    });

    test("a stale value is served through CACHE.GET, never kept", async () => {
      await admin.set(`${p}stale`, '"old"');
      assert.equal(await hold(cache, "stale"), "old");
      await admin.call("CACHE.INVALIDATE", `${p}stale`, "STALE", 10000);
      await cache.sync();
      const hits = near.stats().hits;
      const [peeks, gets] = await calls(admin, "cache.peek", "cache.get");
      // The stale value is served while one caller reloads behind.
      assert.equal(await read(cache, "stale"), "old");
      assert.equal(near.stats().hits, hits);
      const [peeks2, gets2] = await calls(admin, "cache.peek", "cache.get");
      assert.equal(peeks2, peeks + 1);
      assert.equal(gets2, gets + 1);
      // The reload fills "loaded": a fresh value, kept from the next peek on.
      await until(async () => (await admin.get(`${p}stale`)) === '"loaded"', "the reload");
      await cache.sync(); // the fill's invalidation, before the next peek
      assert.equal(await read(cache, "stale"), "loaded");
      assert.equal(await read(cache, "stale"), "loaded");
      assert.equal(near.stats().hits, hits + 1);
    });

    test("a miss loads once for concurrent callers", async () => {
      let loads = 0;
      const load = async () => {
        loads += 1;
        await sleep(30);
        return "one";
      };
      const values = await Promise.all(
        Array.from({ length: 20 }, () => cache.getOrLoad("once", load)),
      );
      assert.deepEqual(new Set(values), new Set(["one"]));
      assert.equal(loads, 1);
      // Not kept from the load: the next read peeks, and keeps that.
      const hits = near.stats().hits;
      await cache.getOrLoad("once", load);
      await cache.getOrLoad("once", load);
      assert.equal(near.stats().hits, hits + 1);
      assert.equal(loads, 1);
    });

    test("invalidate drops the key here at once", async () => {
      await admin.set(`${p}own`, '"mine"');
      assert.equal(await hold(cache, "own"), "mine");
      await cache.invalidate("own");
      assert.equal(await read(cache, "own"), "loaded");
    });

    test("the tracking connection killed: everything goes, it comes back", async () => {
      await admin.set(`${p}kill`, '"k"');
      await hold(cache, "kill");
      const id = near.clientId;
      assert.ok((await tracking(admin)).includes(id));
      const { flushes } = near.stats();
      await admin.call("CLIENT", "KILL", "ID", id);
      await until(() => near.stats().flushes > flushes, "the flush");
      assert.equal(near.size, 0);
      await near.ready();
      assert.notEqual(near.clientId, id);
      assert.equal(await hold(cache, "kill"), "k");
    });
  });
}

describe("near cache bounds", () => {
  let app: AppClient;
  let warden: Warden;
  before(async () => {
    app = await CLIENTS[0].open(server);
    warden = new Warden(app.client);
  });
  after(async () => {
    await warden?.close();
    await app?.close();
  });

  test("at most maxEntries values, the least recently used go first", async () => {
    const cache = warden.cache({ prefix: "bound:n:", near: { maxEntries: 3 } });
    const near = cache.near as NearCache;
    await near.ready();
    for (const k of ["a", "b", "c", "d"]) await admin.set(`bound:n:${k}`, `"${k}"`);
    for (const k of ["a", "b", "c"]) await read(cache, k);
    await read(cache, "a"); // a is used again: b is now the oldest
    await read(cache, "d");
    assert.equal(near.size, 3);
    const hits = near.stats().hits;
    for (const k of ["a", "c", "d"]) await read(cache, k);
    assert.equal(near.stats().hits, hits + 3);
    await read(cache, "b");
    assert.equal(near.stats().hits, hits + 3);
  });

  test("at most maxBytes of values; a bigger value is not kept", async () => {
    const cache = warden.cache({ prefix: "bound:b:", near: { maxBytes: 13 } });
    const near = cache.near as NearCache;
    await near.ready();
    for (const k of ["a", "b", "c"]) await admin.set(`bound:b:${k}`, `"${k}${k}${k}${k}"`); // 6 bytes
    await admin.set("bound:b:big", `"${"x".repeat(20)}"`);
    for (const k of ["a", "b", "c"]) await read(cache, k);
    assert.equal(near.size, 2);
    await read(cache, "big");
    assert.equal(near.size, 2);
    const hits = near.stats().hits;
    await read(cache, "big");
    await read(cache, "c");
    assert.equal(near.stats().hits, hits + 1);
  });

  test("close releases the tracking connection", async () => {
    const before = await tracking(admin);
    const cache = warden.cache({ near: true });
    const near = cache.near as NearCache;
    await near.ready();
    const id = near.clientId;
    assert.ok((await tracking(admin)).includes(id));
    await cache.close();
    assert.equal(near.connected, false);
    await until(async () => !(await tracking(admin)).includes(id), "the connection to close");
    assert.deepEqual(await tracking(admin), before);
  });
});

describe("near cache across a server restart", () => {
  let restartable: Server;
  let plain: Redis;
  let app: AppClient;
  let warden: Warden;
  before(async () => {
    restartable = await Server.start(["--appendonly", "yes", "--appendfsync", "always"]);
    plain = restartable.admin();
    app = await CLIENTS[0].open(restartable);
    warden = new Warden(app.client);
  });
  after(async () => {
    await warden?.close();
    await app?.close();
    plain?.disconnect();
    await restartable?.stop();
  });

  test("a restart flushes it; it reconnects and reads the server's values", async () => {
    const cache = warden.cache({ near: true });
    const near = cache.near as NearCache;
    await near.ready();
    await plain.set("r", '"before"');
    await hold(cache, "r");
    const { flushes } = near.stats();
    await restartable.restart();
    await until(() => near.stats().flushes > flushes, "the flush");
    assert.equal(near.size, 0);
    await until(async () => (await plain.set("r", '"after"')) === "OK", "the server");
    await near.ready();
    assert.equal(await until(() => read(cache, "r").catch(() => null), "a read"), "after");
  });
});

const PAIRS = Number(process.env.WARDEN_NEAR_RACE_PAIRS ?? 10000);

/** Retried until the server answers (it may be restarting or failing over). */
async function must<T>(fn: () => Promise<T>): Promise<T> {
  for (;;) {
    try {
      return await fn();
    } catch {
      await sleep(5);
    }
  }
}

/** The race checker: tasks each own a few keys; a pair is `SET k v+1` and
 * `GET k` (the server's truth, y) on a plain connection, then `sync()` and
 * near reads (x): stale when x < y. `events` run at even steps of progress,
 * each while the writers go on (or, with `quiet`, while they wait). */
async function race(
  name: string,
  cache: Cache,
  plain: Redis,
  pairs: number,
  events: { name: string; quiet?: boolean; run(): Promise<void> }[],
): Promise<void> {
  const TASKS = 8;
  const KEYS = 3;
  const near = cache.near as NearCache;
  await near.ready();
  let done = 0;
  let stale = 0;
  let errors = 0;
  let gate: Promise<void> | undefined;
  let idle = 0;
  let finished = 0;
  const perTask = Math.ceil(pairs / TASKS);
  const task = async (t: number) => {
    const versions = new Array(KEYS).fill(0);
    for (let i = 0; i < perTask; i++) {
      while (gate !== undefined) {
        idle++;
        await gate;
        idle--;
      }
      const k = i % KEYS;
      const key = `t${t}k${k}`;
      versions[k] += 1;
      const v = versions[k];
      await must(() => plain.set(`race:${key}`, String(v)));
      const y = Number(await must(() => plain.get(`race:${key}`)));
      try {
        await near.sync();
        const load = async () => Number(await plain.get(`race:${key}`));
        for (let r = 0; r < 3; r++) {
          const x = Number(await cache.getOrLoad(key, load));
          if (x < y) stale++;
        }
      } catch {
        errors++;
      }
      done++;
    }
    finished++;
  };
  const seen: string[] = [];
  const chaos = async () => {
    for (const [n, event] of events.entries()) {
      await until(() => done >= (pairs * (n + 1)) / (events.length + 1), "progress", 60000);
      await until(() => near.connected, "the near cache to connect", 10000);
      const { flushes } = near.stats();
      let open = () => {};
      if (event.quiet) {
        gate = new Promise((resolve) => {
          open = resolve;
        });
        await until(() => idle + finished === TASKS, "the writers to wait");
      }
      await event.run();
      // Seen before the next event (one drop is one flush).
      await until(() => near.stats().flushes > flushes, `the flush after ${event.name}`, 10000);
      seen.push(event.name);
      gate = undefined;
      open();
    }
  };
  await Promise.all([...Array.from({ length: TASKS }, (_, t) => task(t)), chaos()]);
  const { hits, flushes } = near.stats();
  console.log(
    `near race (${name}, ${kind()}): pairs ${done}, stale ${stale}, errors ${errors}, hits ${hits}, flushes ${flushes}, events ${seen.join(" ")}`,
  );
  assert.equal(done, TASKS * perTask);
  assert.equal(stale, 0);
  assert.ok(hits > 0);
  assert.equal(seen.length, events.length);
  assert.ok(flushes >= events.length);
}

describe("near cache race checker", () => {
  let racing: Server;
  let plain: Redis;
  let admin2: Redis;
  let app: AppClient;
  let warden: Warden;
  before(async () => {
    racing = await Server.start(["--appendonly", "yes", "--appendfsync", "always"]);
    plain = racing.admin();
    admin2 = racing.admin();
    app = await CLIENTS[0].open(racing);
    warden = new Warden(app.client);
  });
  after(async () => {
    await warden?.close();
    await app?.close();
    plain?.disconnect();
    admin2?.disconnect();
    await racing?.stop();
  });

  test(`no read after sync() returns an older value (${PAIRS} pairs, kills and restarts)`, async () => {
    const cache = warden.cache({ prefix: "race:", near: true });
    const kill = {
      name: "kill",
      run: async () => {
        await must(() => admin2.call("CLIENT", "KILL", "ID", (cache.near as NearCache).clientId));
      },
    };
    const restart = { name: "restart", run: () => racing.restart() };
    await race("kills, restarts", cache, plain, PAIRS, [kill, restart, kill, restart]);
  });
});

describe("near cache race checker through Sentinel", () => {
  let master: Server;
  let replica: Server;
  let sentinel: ChildProcess;
  let sentinelPort: number;
  let sentinelDir = "";
  let plain: Redis;
  let app: Redis;
  let warden: Warden;
  before(async () => {
    const [p1, p2, p3] = [await freePort(), await freePort(), await freePort()];
    const durable = ["--appendonly", "yes", "--appendfsync", "always"];
    master = await Server.start(durable, p1);
    replica = await Server.start([...durable, "--replicaof", "127.0.0.1", String(p1)], p2);
    sentinelPort = p3;
    sentinelDir = mkdtempSync(join(tmpdir(), "warden-node-sentinel-"));
    const conf = join(sentinelDir, "sentinel.conf");
    writeFileSync(
      conf,
      [
        `port ${p3}`,
        "bind 127.0.0.1",
        `dir ${sentinelDir}`,
        `sentinel monitor m 127.0.0.1 ${p1} 1`,
        "sentinel down-after-milliseconds m 1000",
        "sentinel failover-timeout m 10000",
        "",
      ].join("\n"),
    );
    sentinel = spawn(SERVER, [conf, "--sentinel"], { stdio: "ignore" });
    const sentinels = [{ host: "127.0.0.1", port: p3 }];
    const options = { sentinels, name: "m", reconnectOnError: () => true };
    plain = new Redis(options);
    plain.on("error", () => {});
    app = new Redis(options);
    app.on("error", () => {});
    warden = new Warden(app);
  });
  after(async () => {
    await warden?.close();
    app?.disconnect();
    plain?.disconnect();
    sentinel?.kill("SIGKILL");
    await replica?.stop();
    await master?.stop(); // again: a no-op once stopped
    if (sentinelDir) rmSync(sentinelDir, { recursive: true, force: true });
  });

  test("a failover (SENTINEL FAILOVER, the old master stopped): it follows the new master", async () => {
    const cache = warden.cache({ prefix: "race:", near: true });
    const ask = new Redis({ host: "127.0.0.1", port: sentinelPort, lazyConnect: true });
    ask.on("error", () => {});
    try {
      const failover = {
        name: "failover",
        quiet: true, // no write is lost: the replica has every acknowledged one
        run: async () => {
          const old = (await ask.call("SENTINEL", "get-master-addr-by-name", "m")) as string[];
          await until(
            async () => (await ask.call("SENTINEL", "FAILOVER", "m").catch(() => "")) === "OK",
            "Sentinel to fail over",
            15000,
          );
          await until(
            async () =>
              ((await ask.call("SENTINEL", "get-master-addr-by-name", "m")) as string[])[1] !==
              old[1],
            "the new master",
            15000,
          );
          // Sentinel demotes a live old master only seconds later (and then
          // closes its clients); here it goes away at once.
          await master.stop();
        },
      };
      await until(
        async () => {
          const replicas = (await ask
            .call("SENTINEL", "replicas", "m")
            .catch(() => [])) as unknown[];
          return replicas.length > 0;
        },
        "Sentinel to see the replica",
        10000,
      );
      await race("Sentinel failover", cache, plain, Math.ceil(PAIRS / 5), [failover]);
    } finally {
      ask.disconnect();
    }
  });
});

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

function kind(): string {
  return (process.env.WARDEN_SERVER ?? "redis-server").split("/").pop() as string;
}
