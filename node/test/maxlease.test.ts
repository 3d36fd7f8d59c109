// Leases and the server's cap (warden.max-lease): a lease asked for above it
// is capped and renewed until it ends; the watchdog's lease is the cap when
// that is lower. Against a server started with --warden.max-lease 1000; the
// timings leave wide margins (held at 2 s, gone by 5 s).
import assert from "node:assert/strict";
import { after, before, beforeEach, describe, test } from "node:test";
import type { Redis } from "ioredis";
import { LockLostError, Warden } from "warden-redis";
import { type AppClient, CLIENTS, Server, info, sleep } from "./servers.js";

const CAP = 1000;

let server: Server;
let admin: Redis;
before(async () => {
  server = await Server.start(["--warden.max-lease", String(CAP)]);
  admin = server.admin();
});
after(async () => {
  admin?.disconnect();
  await server?.stop();
});

async function extends_(): Promise<number> {
  const text = String(await admin.info("commandstats"));
  let calls = 0;
  for (const m of text.matchAll(/^cmdstat_[a-z]+\.extend:calls=(\d+)/gm)) calls += Number(m[1]);
  return calls;
}

describe("leases over warden.max-lease", () => {
  const apps: AppClient[] = [];
  const wardens: Warden[] = [];
  before(async () => {
    for (const kind of CLIENTS) {
      const app = await kind.open(server);
      apps.push(app);
      wardens.push(new Warden(app.client));
    }
  });
  after(async () => {
    for (const w of wardens) await w.close();
    for (const app of apps) await app.close();
  });
  beforeEach(async () => {
    await admin.flushall();
    await admin.config("SET", "warden.max-lease", String(CAP));
  });

  test("a lease over the cap is held until it ends, with every client library", async () => {
    const holds = await Promise.all(
      wardens.map(async (w, i) => [
        await w.lock(`lock:${i}`, { ttl: 3000 }),
        await w.readWriteLock(`rw:${i}`).write({ ttl: 3000 }),
        await w.semaphore(`sem:${i}`, 1).acquire({ ttl: 3000 }),
      ]),
    );
    const pttl = await admin.pttl("lock:0");
    assert.ok(pttl > 0 && pttl <= CAP, `the server holds at most the cap: ${pttl}`);
    await sleep(2000);
    for (const hold of holds.flat()) assert.equal(hold.held, true);
    for (let i = 0; i < wardens.length; i++) assert.notEqual(await info(admin, `lock:${i}`), null);
    await sleep(3000);
    for (const hold of holds.flat()) assert.equal(hold.held, false);
    for (let i = 0; i < wardens.length; i++) {
      assert.equal(await admin.exists(`lock:${i}`, `rw:${i}`, `sem:${i}`), 0);
    }
  });

  test("the watchdog renews at the cap, a lowered cap too; release stops it", async () => {
    const warden = wardens[0];
    const lock = await warden.lock("job");
    const other = await warden.lock("other");
    const pttl = await admin.pttl("job");
    assert.ok(pttl > 0 && pttl <= CAP, `the watchdog's lease is the cap: ${pttl}`);
    await admin.config("SET", "warden.max-lease", "600");
    await sleep(2500);
    assert.equal(lock.held, true);
    assert.equal((await info(admin, "job")).owner, lock.owner);
    assert.ok((await admin.pttl("job")) <= 600);
    await lock.release();
    await other.release();
    const before = await extends_();
    await sleep(1500);
    assert.equal(await extends_(), before);
    assert.equal(await admin.exists("job"), 0);
  });

  test("release stops the renewal of a capped lease", async () => {
    const lock = await wardens[0].lock("job", { ttl: 30000 });
    await sleep(600);
    await lock.release();
    const before = await extends_();
    await sleep(1500);
    assert.equal(await extends_(), before);
    assert.equal(await admin.exists("job"), 0);
  });

  test("extend over the cap is capped and renewed", async () => {
    const lock = await wardens[0].lock("job", { ttl: 500 });
    await lock.extend(3000);
    await sleep(2000);
    assert.equal(lock.held, true);
    assert.notEqual(await info(admin, "job"), null);
    await sleep(3000);
    assert.equal(lock.held, false);
    assert.equal(await admin.exists("job"), 0);
  });

  test("a deleted key stops renewal and the loss shows", async () => {
    const lock = await wardens[0].lock("job", { ttl: 60000 });
    const lost = new Promise((resolve) => lock.lost.addEventListener("abort", resolve));
    await admin.del("job");
    await Promise.race([
      lost,
      sleep(3000).then(() => assert.fail("the loss did not show within 3 s")),
    ]);
    assert.equal(lock.held, false);
    assert.ok(lock.lost.reason instanceof LockLostError);
    const before = await extends_();
    await sleep(1000);
    assert.equal(await extends_(), before);
    await assert.rejects(lock.release(), LockLostError);
  });
});
