// Cluster clients route by key: a three-master cluster (TCP ports 7830-7832),
// with ioredis' Cluster and node-redis' createCluster.

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { Cluster, type Redis } from "ioredis";
import { createCluster } from "redis";
import { Warden } from "warden-redis";
import { Server, info, until } from "./servers.js";

const PORTS = [7830, 7831, 7832];
let servers: Server[] = [];
let admins: Redis[] = [];

before(async () => {
  servers = await Promise.all(
    PORTS.map((port) =>
      Server.start(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"], port),
    ),
  );
  admins = servers.map((s) => s.admin());
  const per = Math.ceil(16384 / PORTS.length);
  await Promise.all(
    admins.map((a, i) =>
      a.call("CLUSTER", "ADDSLOTSRANGE", i * per, Math.min(16383, (i + 1) * per - 1)),
    ),
  );
  for (const port of PORTS.slice(1)) await admins[0].call("CLUSTER", "MEET", "127.0.0.1", port);
  await until(
    async () => {
      for (const a of admins) {
        const text = String(await a.call("CLUSTER", "INFO"));
        if (!text.includes("cluster_state:ok") || !text.includes("cluster_known_nodes:3")) {
          return false;
        }
      }
      return true;
    },
    "the cluster to form",
    20000,
  );
});

after(async () => {
  for (const a of admins) a.disconnect();
  await Promise.all(servers.map((s) => s.stop()));
});

/** The admin connection of the master that serves `key`. */
async function owner(key: string): Promise<Redis> {
  const slot = Number(await admins[0].call("CLUSTER", "KEYSLOT", key));
  const per = Math.ceil(16384 / PORTS.length);
  return admins[Math.floor(slot / per)];
}

const KINDS = [
  {
    name: "ioredis Cluster",
    open: async () => {
      const c = new Cluster([{ host: "127.0.0.1", port: PORTS[0] }]);
      c.on("error", () => {});
      await new Promise((resolve) => c.once("ready", resolve));
      return { client: c, close: async () => c.disconnect() };
    },
  },
  {
    name: "node-redis createCluster",
    open: async () => {
      const c = createCluster({ rootNodes: [{ url: `redis://127.0.0.1:${PORTS[0]}` }] });
      c.on("error", () => {});
      await c.connect();
      return { client: c, close: async () => c.destroy() };
    },
  },
];

for (const kind of KINDS) {
  describe(`cluster with ${kind.name}`, () => {
    test("locks and waits reach the master of each key", async () => {
      const app = await kind.open();
      const warden = new Warden(app.client);
      try {
        const keys = ["a", "b", "c", "d", "e", "f"].map((k) => `${kind.name}:${k}`);
        const seen = new Set<Redis>();
        for (const key of keys) seen.add(await owner(key));
        assert.ok(seen.size > 1, "the keys span masters");
        await Promise.all(
          keys.map(async (key) => {
            let inside = 0;
            let last = 0n;
            await Promise.all(
              Array.from({ length: 10 }, async () => {
                const lock = await warden.lock(key, { ttl: 10000 });
                inside += 1;
                assert.equal(inside, 1);
                assert.ok(lock.fence > last);
                last = lock.fence;
                assert.equal((await info(await owner(key), key)).owner, lock.owner);
                inside -= 1;
                await lock.release();
              }),
            );
          }),
        );
        const cache = warden.cache();
        let loads = 0;
        const values = await Promise.all(
          keys.map((key) =>
            cache.getOrLoad(`cached:${key}`, async () => {
              loads += 1;
              return key;
            }),
          ),
        );
        assert.deepEqual(values, keys.map(String));
        assert.equal(loads, keys.length);
      } finally {
        await warden.close();
        await app.close();
      }
    });

    test("rate limiters wait in the queue of each key's master", async () => {
      const app = await kind.open();
      const warden = new Warden(app.client);
      try {
        const keys = ["a", "b", "c", "d", "e", "f"].map((k) => `${kind.name}:rate:${k}`);
        await Promise.all(
          keys.map(async (key) => {
            const limiter = warden.rateLimiter(key, { count: 10, period: 1000, burst: 1 });
            assert.ok((await limiter.acquire()).allowed);
            assert.ok((await limiter.acquire(1, { wait: 5000 })).allowed, "waited ~100 ms");
            assert.notEqual(await (await owner(key)).call("RATE.INFO", key), null);
            assert.equal(await limiter.refund(1), true);
          }),
        );
      } finally {
        await warden.close();
        await app.close();
      }
    });
  });
}
