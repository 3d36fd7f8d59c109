#!/usr/bin/env python3
"""Installs what `make dist` built, as a user would, and runs it.

    scripts/dist-test.py <dist dir> <version> [--server-only]

(--server-only: the module and the wheel only, the parts a server changes.)

- the module: the README's Install block unpacks the tarball and starts
  redis-server with the tarball's redis.conf.example and libwarden.so;
- the Python package: the README's `pip install warden-redis`, into a fresh
  venv, from the wheel in dist/ alone (PIP_NO_INDEX, PIP_FIND_LINKS; redis-py
  at python/constraints.txt's pin), then a lock and a cache read through it;
- the Rust crate: a scratch project whose Cargo.toml has the README's
  dependency lines, with `warden-client` patched to the unpacked .crate, runs
  the crate's own examples/readme.rs, every crate at the version Cargo.lock pins;
- the Node package: the npm pack tarball installed into a fresh project beside
  ioredis and node-redis (npm ci: tests/node/package-lock.json's versions), a
  lock taken and released through each client, by ESM import and by CommonJS
  require, and both entry points' types checked by tsc; then `npm install
  ./node` from a copy of node/'s tracked files (no dist/, no node_modules/,
  as in a fresh clone), which builds through the package's `prepare` script;
- the Java client: dist/maven as the team repository the README's pom.xml
  block names (checksumPolicy fail), a Spring Boot 3 and a Spring Boot 4
  application built against it and run;
- the Go module: the README's Go install block (dist/goproxy first in
  GOPROXY, then proxy.golang.org; the checksum database on for all but
  warden) in a fresh module cache, for a module that also needs redsync
  from the proxy; it builds and runs the README's Go snippet; a changed
  go-redis in the directory is refused by the checksum database, a changed
  warden by go.sum. It needs proxy.golang.org (and its checksum database).

Blocks of README.md's Install section marked `<!-- test: install -->` are
run as written (`as=Cargo.toml`: the scratch project's dependencies; `as=go`:
run by the Go test, beside `goproxy/`), with
`redis-server` a shell function that keeps the server on a test port in a
scratch directory (and without the 41 s grace window of the shipped
configuration, which tests/production_config.rs checks). Servers take ports
from WARDEN_TEST_PORTS (`7700-7799`), else any free one; WARDEN_SERVER names
the server binary. Only the standard library: it runs before any venv.
"""

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fail(msg: str) -> None:
    sys.exit(f"dist-test: {msg}")


def one(dist: Path, pattern: str) -> Path:
    found = sorted(dist.glob(pattern))
    if len(found) != 1:
        fail(f"expected one {pattern} in {dist}, found {[p.name for p in found]}")
    return found[0]


def install_blocks() -> list:
    """(options, code) of each `<!-- test: install ... -->` block, in page order."""
    lines = (ROOT / "README.md").read_text().splitlines()
    blocks = []
    for i, line in enumerate(lines):
        m = re.fullmatch(r"\s*<!--\s*test:\s*install(.*?)-->\s*", line)
        if not m:
            continue
        options = dict(w.split("=", 1) for w in m.group(1).split())
        fence = lines[i + 1]
        indent = len(fence) - len(fence.lstrip())
        body = []
        for body_line in lines[i + 2 :]:
            if body_line.strip() == "```":
                break
            body.append(body_line[indent:])
        blocks.append((options, "\n".join(body) + "\n"))
    return blocks


def free_port() -> int:
    spec = os.environ.get("WARDEN_TEST_PORTS", "")
    low, _, high = spec.partition("-")
    candidates = range(int(low), int(high) + 1) if low and high else [0]
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    fail(f"no free port in {spec}")
    return 0


def run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("text", True)
    kw.setdefault("capture_output", True)
    out = subprocess.run(cmd, **kw)
    if out.returncode != 0:
        fail(f"{cmd if isinstance(cmd, str) else shlex.join(map(str, cmd))} failed:\n"
             f"{out.stdout}\n{out.stderr}")
    return out


def crates(lock_file: Path) -> set:
    """The registry crates a Cargo.lock pins, as "name version"."""
    text = lock_file.read_text()
    return {f"{n} {v}" for n, v, s in re.findall(
        r'\[\[package\]\]\nname = "([^"]+)"\nversion = "([^"]+)"\n(source = "registry)?', text) if s}


def wait_for(what: str, cond, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(0.05)


# A lock through each client, by import (ESM) and by require (CommonJS); the
# package must resolve inside the project, not in the checkout.
NODE_ESM = """
import assert from "node:assert/strict";
import { realpathSync } from "node:fs";
import { createRequire } from "node:module";
import { Redis } from "ioredis";
import { createClient } from "redis";
import { Warden, LockBusyError } from "warden-redis";

const where = realpathSync(createRequire(import.meta.url).resolve("warden-redis"));
assert.ok(where.startsWith(process.env.WARDEN_EXPECT_UNDER), where);
const url = process.env.REDIS_URL;
const ioredis = new Redis(url);
const nodeRedis = createClient({ url });
await nodeRedis.connect();
for (const [name, client] of [["ioredis", ioredis], ["node-redis", nodeRedis]]) {
  const warden = new Warden(client);
  const lock = await warden.lock(`dist:${name}`, { ttl: 10000, wait: 5000 });
  assert.equal(typeof lock.fence, "bigint");
  assert.equal(await warden.tryLock(`dist:${name}`, { ttl: 10000 }), null);
  await lock.release();
  const again = await warden.tryLock(`dist:${name}`, { ttl: 10000 });
  assert.ok(again && again.fence > lock.fence);
  await again.release();
  await warden.close();
  console.log(`node: warden-redis (import) with ${name}: lock ${lock.fence} acquired and released`);
}
assert.ok(LockBusyError.prototype instanceof Error);
ioredis.disconnect();
await nodeRedis.quit();
"""

NODE_CJS = """
const assert = require("node:assert/strict");
const { Redis } = require("ioredis");
const { Warden } = require("warden-redis");
assert.ok(require.resolve("warden-redis").endsWith("/dist/cjs/index.js"), require.resolve("warden-redis"));
(async () => {
  const client = new Redis(process.env.REDIS_URL);
  const warden = new Warden(client);
  const lock = await warden.lock("dist:cjs", { ttl: 10000, wait: 5000 });
  await lock.release();
  await warden.close();
  client.disconnect();
  console.log(`node: warden-redis (require) with ioredis: lock ${lock.fence} acquired and released`);
})().catch((e) => { console.error(e); process.exit(1); });
"""

# Both entry points' declarations, as a TypeScript user compiles against them.
NODE_TYPES = {
    "esm.mts": 'import { Warden, type Lock } from "warden-redis";\n'
    'export const f = async (w: Warden): Promise<bigint> => {\n'
    '  const lock: Lock = await w.lock("k", { ttl: 1000 });\n'
    '  return lock.fence;\n};\n',
    "cjs.cts": 'import wr = require("warden-redis");\n'
    'export const f = async (w: wr.Warden): Promise<bigint> => (await w.lock("k")).fence;\n',
    "tsconfig.json": '{ "compilerOptions": { "strict": true, "noEmit": true, "target": "ES2022",'
    ' "module": "NodeNext", "moduleResolution": "NodeNext", "types": ["node"],'
    ' "lib": ["ES2022", "ESNext.Disposable"] }, "include": ["*.mts", "*.cts"] }\n',
}


def locked_versions(lock_file: Path) -> dict:
    """{path in node_modules: version} of a package-lock.json."""
    packages = json.loads(lock_file.read_text())["packages"]
    return {path: p.get("version") for path, p in packages.items() if path}


def node_test(npm_tarball: Path, scratch: Path, port: int) -> None:
    """The npm pack tarball and `npm install ./node`, each in a fresh project."""
    npm_env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{port}",
               "npm_config_audit": "false", "npm_config_fund": "false",
               "npm_config_update_notifier": "false", "npm_config_loglevel": "error"}
    npm_install = ["npm", "install", "--prefer-offline"]
    tsc = ROOT / "node/node_modules/typescript/bin/tsc"
    node_types = ROOT / "node/node_modules/@types"

    # ioredis and node-redis, and all they depend on, at the versions
    # tests/node/package-lock.json pins (npm ci); then the tarball beside them,
    # which must leave every one of those where it was.
    project = scratch / "node-project"
    project.mkdir()
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / "tests/node" / name, project / name)
    run(["npm", "ci", "--prefer-offline", "--ignore-scripts"], cwd=project, env=npm_env)
    pinned = locked_versions(project / "package-lock.json")
    # No TypeScript here: installing the tarball builds nothing.
    run(npm_install + ["--ignore-scripts", str(npm_tarball)], cwd=project, env=npm_env)
    now = locked_versions(project / "package-lock.json")
    moved = sorted(f"{p} {v} (pinned {now.get(p)})" for p, v in pinned.items() if now.get(p) != v)
    added = sorted(f"{p} {v}" for p, v in now.items() if p not in pinned and p != "node_modules/warden-redis")
    if moved or added:
        fail("installing the npm tarball moved pinned packages: " + ", ".join(moved + added))
    if (project / "node_modules/typescript").exists():
        fail("installing the npm tarball brought TypeScript")
    env = {**npm_env, "WARDEN_EXPECT_UNDER": str(project / "node_modules/warden-redis")}
    (project / "smoke.mjs").write_text(NODE_ESM)
    (project / "smoke.cjs").write_text(NODE_CJS)
    print(run(["node", "smoke.mjs"], cwd=project, env=env).stdout, end="")
    print(run(["node", "smoke.cjs"], cwd=project, env=env).stdout, end="")
    types = project / "types"
    types.mkdir()
    for name, text in NODE_TYPES.items():
        (types / name).write_text(text)
    run(["node", str(tsc), "-p", str(types), "--typeRoots", str(node_types)], cwd=types)
    print("node: warden-redis's types check from import and from require")

    # `npm install ./node` as from a fresh clone: node/'s tracked files only.
    clone = scratch / "node-clone"
    files = run(["git", "ls-files", "-co", "--exclude-standard", "node"], cwd=ROOT).stdout.split()
    for f in files:
        (clone / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, clone / f)
    (clone / "package.json").write_text('{ "private": true }\n')
    run(npm_install + ["./node"], cwd=clone, env=npm_env)
    probe = ('import("warden-redis").then((m) => { const c = require("warden-redis");'
             ' if (!m.Warden || !c.Warden) process.exit(1); console.log("ok"); })')
    run(["node", "-e", probe], cwd=clone, env=npm_env)
    print("node: npm install ./node (built by its prepare script) imports and requires")


# A Spring Boot application on the README's Java lines: the Warden, the
# CacheManager and a lock, all from Boot's auto-configuration and
# spring.data.redis.* (the same source for Boot 3 and Boot 4).
JAVA_MAIN = """
package smoke;

import io.warden.Warden;
import io.warden.WardenLock;
import java.time.Duration;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.SpringBootVersion;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.cache.CacheManager;
import org.springframework.cache.annotation.EnableCaching;
import org.springframework.context.ConfigurableApplicationContext;

@SpringBootApplication
@EnableCaching
public class Smoke {
  public static void main(String[] args) throws Exception {
    try (ConfigurableApplicationContext ctx = SpringApplication.run(Smoke.class, args)) {
      Warden warden = ctx.getBean(Warden.class);
      CacheManager caches = ctx.getBean(CacheManager.class);
      try (WardenLock lock = warden.lock("dist:java").lease(Duration.ofSeconds(10)).acquire()) {
        String v = caches.getCache("dist").get("k", () -> "v");
        System.out.println("java: Spring Boot " + SpringBootVersion.getVersion() + ", "
            + caches.getClass().getSimpleName() + ": lock " + lock.fence() + " held, cache " + v);
      }
    }
  }
}
"""

# Each Boot line the README names, with the artifact it says to use there.
BOOTS = (("3.5.7", "warden-spring-boot3"), ("4.0.7", "warden-spring"))


# The version java/pom.xml pins (a bare dependency:... goal would take the newest).
DEPENDENCY_PLUGIN = re.search(
    r"<artifactId>maven-dependency-plugin</artifactId>\s*<version>([^<]+)</version>",
    (ROOT / "java/pom.xml").read_text()).group(1)


def java_test(dist: Path, version: str, port: int) -> None:
    """dist/maven as a team's repository, as the README's Install block names
    it (checksumPolicy fail): a Spring Boot 3 and a Spring Boot 4 application
    resolve warden from it alone (their local repository holds no io.warden;
    the rest comes from ~/.m2 or Maven Central), start on the test server and
    take a lock and a cache entry."""
    repo = dist / "maven"
    for artifact in ("warden-core", "warden-lettuce", "warden-jedis", "warden-spring",
                     "warden-spring-boot3", "warden-shedlock"):
        base = repo / "io/warden" / artifact / version / f"{artifact}-{version}"
        for suffix in (".jar", ".pom", "-sources.jar", "-javadoc.jar"):
            for checksum in ("", ".sha1", ".md5", ".sha256", ".sha512"):
                if not Path(f"{base}{suffix}{checksum}").is_file():
                    fail(f"{repo}: no {base.name}{suffix}{checksum}")
    if not (repo / f"io/warden/warden-parent/{version}/warden-parent-{version}.pom").is_file():
        fail(f"{repo}: no warden-parent {version} POM")
    blocks = [code for options, code in install_blocks() if options.get("as") == "pom.xml"]
    if len(blocks) != 1 or f"<version>{version}</version>" not in blocks[0]:
        fail("README's Install section: expected one pom.xml block naming version " + version)
    smoke = ROOT / "target/dist-smoke/java"
    local = smoke / "m2"
    shutil.rmtree(local / "io/warden", ignore_errors=True)
    home = Path.home() / ".m2/repository"
    for boot, artifact in BOOTS:
        project = smoke / f"boot{boot.split('.')[0]}"
        shutil.rmtree(project, ignore_errors=True)
        (project / "src/main/java/smoke").mkdir(parents=True)
        (project / "src/main/java/smoke/Smoke.java").write_text(JAVA_MAIN)
        lines = blocks[0].replace("file:///path/to/dist/maven", f"file://{repo}")
        lines = lines.replace("<artifactId>warden-spring</artifactId>",
                              f"<artifactId>{artifact}</artifactId>")
        # ~/.m2 after the team's repository, checksums not asked of it: it spares
        # downloading Spring again where java-test fetched it.
        lines = lines.replace("</repositories>", f"""  <repository>
    <id>home</id><url>file://{home}</url>
    <releases><checksumPolicy>ignore</checksumPolicy></releases>
  </repository>
</repositories>""")
        lines = lines.replace("</dependencies>", """  <dependency>
    <groupId>org.springframework.boot</groupId><artifactId>spring-boot-starter-data-redis</artifactId>
  </dependency>
</dependencies>""")
        (project / "pom.xml").write_text(f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <parent>
    <groupId>org.springframework.boot</groupId><artifactId>spring-boot-starter-parent</artifactId>
    <version>{boot}</version><relativePath/>
  </parent>
  <groupId>example</groupId><artifactId>smoke-boot</artifactId><version>0</version>
  <properties><java.version>17</java.version></properties>
{lines}</project>
""")
        mvn = ["mvn", "-B", "-ntp", "-q", f"-Dmaven.repo.local={local}"]
        classpath_goal = f"org.apache.maven.plugins:maven-dependency-plugin:{DEPENDENCY_PLUGIN}:build-classpath"
        run(mvn + ["compile", classpath_goal, "-Dmdep.outputFile=cp.txt"], cwd=project)
        origin = local / f"io/warden/{artifact}/{version}/_remote.repositories"
        if not origin.is_file() or ">warden=" not in origin.read_text():
            fail(f"Boot {boot}: {artifact} did not come from dist/maven")
        classpath = (project / "cp.txt").read_text().strip() + os.pathsep + str(project / "target/classes")
        out = run(["java", "-cp", classpath, "smoke.Smoke", f"--spring.data.redis.port={port}",
                   "--spring.main.banner-mode=off", "--logging.level.root=warn"]).stdout
        if f"java: Spring Boot {boot}, WardenCacheManager: lock" not in out:
            fail(f"the Boot {boot} application printed:\n{out}")
        print(next(line for line in out.splitlines() if line.startswith("java:")))


# The README's Go snippet as readme(), and redsync on the same go-redis
# client: a module that needs warden from dist/goproxy and another public
# module from the proxy.
GO_MAIN = """package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	warden "github.com/warden-redis/warden/go"
)

func readme() {
%s
}

func main() {
	readme()
	opt, _ := redis.ParseURL(os.Getenv("REDIS_URL"))
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	m := redsync.New(goredis.NewPool(rdb)).NewMutex("dist:redsync")
	if err := m.Lock(); err != nil {
		fmt.Println(err)
		return
	}
	ok, err := m.Unlock()
	fmt.Println("redsync", ok, err)
}
"""

# The other public module the Go test's module needs: from the proxy, its
# checksums from the checksum database (bench/go.mod's version).
GO_OTHER = "github.com/go-redsync/redsync/v4@v4.17.0"


def tamper_zip(zip_path: Path) -> None:
    """Adds a file to a module zip: its hash no longer matches any record."""
    import zipfile

    with zipfile.ZipFile(zip_path) as z:
        first = z.namelist()[0]  # <module path>@<version>/<file>
        prefix = first[: first.index("/", first.index("@"))]
    with zipfile.ZipFile(zip_path, "a") as z:
        z.writestr(f"{prefix}/tampered.go", "package tampered\n")


def go_test(dist: Path, version: str, port: int) -> None:
    """The README's Go install block, as written: dist/goproxy first in
    GOPROXY, the module proxy for the rest, the checksum database on for
    every module but warden. A module that needs warden and redsync (from
    proxy.golang.org) gets both, builds with go.sum as `go get` wrote it
    (-mod=readonly, the default) and runs the README's Go snippet against
    the server. Then what the checksums guard: the checksum database was
    asked for redsync and for the modules dist/goproxy serves besides
    warden, not for warden; a directory whose go-redis differs from the
    published one is refused (checksum database); a warden zip that differs
    from the one go.sum recorded is refused (go.sum)."""
    proxy = one(dist, "goproxy")
    readme = (ROOT / "README.md").read_text()
    blocks = [code for options, code in install_blocks() if options.get("as") == "go"]
    snippet = re.search(r"checks it is ExampleWarden_Lock[^>]*-->\n```go\n(.*?)\n```", readme, re.S)
    if len(blocks) != 1 or f"github.com/warden-redis/warden/go@v{version}" not in blocks[0] or not snippet:
        fail(f"README.md: no Go install block naming github.com/warden-redis/warden/go@v{version}, or no Go snippet")
    page = (ROOT / "docs/clients/go.md").read_text()
    if "is the README's Go install block" not in page or f"```sh\n{blocks[0]}```" not in page:
        fail("docs/clients/go.md: its install block is not the README's Go install block")
    smoke = Path(tempfile.mkdtemp(prefix="warden-go-"))
    # A fresh module cache at a path that stays put: the go command's build
    # cache keys hold the source's path, so a later run compiles go-redis
    # and redsync again only when they changed (a temporary path: ~1 min of
    # CPU each time).
    modcache = ROOT / "target/dist-smoke/go-modcache"
    if modcache.exists():
        subprocess.run(["chmod", "-R", "u+w", str(modcache)])
        shutil.rmtree(modcache)
    go = shutil.which("go") or "/usr/local/go/bin/go"
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("GO") or k in ("GOROOT", "GOPATH", "GOCACHE")}
    # goindex=0: the go command indexes a module cache directory once, by its
    # path, and keeps the index in GOCACHE; warden's unreleased version is
    # rebuilt with other files at the same path, so a kept index would name
    # the files of an earlier build.
    base.update(GOTOOLCHAIN="local", GOENV="off", GODEBUG="goindex=0",
                REDIS_URL=f"redis://127.0.0.1:{port}",
                PATH=f"{Path(go).parent}:{os.environ['PATH']}")
    try:
        # The block runs where the release was unpacked: goproxy/ beside it.
        (smoke / "goproxy").symlink_to(proxy)
        body = "\n".join("\t" + line for line in snippet.group(1).splitlines())
        (smoke / "main.go.txt").write_text(GO_MAIN % body)
        script = (blocks[0] + f"go get {GO_OTHER}\n"
                  "cp ../main.go.txt main.go\n"
                  "go build -mod=readonly -o app . && ./app\n"
                  "go env GOPROXY GONOSUMDB GOSUMDB GOFLAGS GONOPROXY > ../env.txt\n")
        env = {**base, "GOMODCACHE": str(modcache), "GOFLAGS": "-x"}
        out = run(["bash", "-euo", "pipefail", "-c", script], cwd=smoke, env=env)
        if out.stdout.splitlines()[-2:] != ["locked true", "redsync true <nil>"]:
            fail(f"the Go module printed:\n{out.stdout}")
        goproxy, nosumdb, sumdb, _, noproxy = ((smoke / "env.txt").read_text().split("\n") + [""] * 5)[:5]
        if not goproxy.startswith(f"file://{smoke}/goproxy,") or sumdb in ("", "off") or noproxy:
            fail(f"the README's Go block set GOPROXY={goproxy} GOSUMDB={sumdb} GONOPROXY={noproxy}")
        asked = set(re.findall(r"sumdb/sum\.golang\.org/lookup/(\S+?)@", out.stderr))
        for path in ("github.com/go-redsync/redsync/v4", "github.com/redis/go-redis/v9"):
            if path not in asked:
                fail(f"the checksum database was not asked for {path}: asked for {sorted(asked)}")
        if any(p.startswith("github.com/warden-redis/") for p in asked):
            fail(f"the checksum database was asked for warden: {sorted(asked)}")
        app = smoke / "app"
        gosum = (app / "go.sum").read_text()
        for path in ("github.com/warden-redis/warden/go v" + version, "github.com/go-redsync/redsync/v4 v4.17.0"):
            if path + " h1:" not in gosum:
                fail(f"go.sum has no hash of {path}:\n{gosum}")
        print(f"go: warden {version} from dist/goproxy and {GO_OTHER} from the proxy, built with "
              f"GOPROXY={goproxy.replace(str(smoke), '.')} GONOSUMDB={nosumdb}: {' / '.join(out.stdout.splitlines()[-2:])}; "
              f"checksum database asked for {len(asked)} modules, not warden")

        # A directory that serves something else under the same versions.
        bad = smoke / "bad-goproxy"
        shutil.copytree(proxy, bad)
        tamper_zip(bad / f"github.com/warden-redis/warden/go/@v/v{version}.zip")
        tamper_zip(bad / "github.com/redis/go-redis/v9/@v/v9.23.0.zip")
        bad_env = {**base, "GOPROXY": f"file://{bad},https://proxy.golang.org,direct",
                   "GONOSUMDB": nosumdb, "GOFLAGS": ""}
        # go-redis, new to a module: the checksum database refuses it.
        fresh = smoke / "fresh"
        fresh.mkdir()
        run([go, "mod", "init", "example.com/fresh"], cwd=fresh, env={**bad_env, "GOMODCACHE": str(smoke / "mc1")})
        got = subprocess.run([go, "get", "github.com/redis/go-redis/v9@v9.23.0"], cwd=fresh, text=True,
                             capture_output=True, env={**bad_env, "GOMODCACHE": str(smoke / "mc1")})
        if got.returncode == 0 or "SECURITY ERROR" not in got.stderr:
            fail(f"a go-redis zip that differs from the published one was taken:\n{got.stderr}")
        # warden, in a module whose go.sum recorded it: go.sum refuses it.
        got = subprocess.run([go, "build", "-o", "/dev/null", "."], cwd=app, text=True,
                             capture_output=True, env={**bad_env, "GOMODCACHE": str(smoke / "mc2")})
        if got.returncode == 0 or "SECURITY ERROR" not in got.stderr or "warden" not in got.stderr:
            fail(f"a warden zip that differs from the one go.sum recorded was taken:\n{got.stderr}")
        print("go: a changed go-redis refused by the checksum database, a changed warden by go.sum")
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(smoke)])
        shutil.rmtree(smoke, ignore_errors=True)


def main() -> None:
    dist, version = Path(sys.argv[1]).resolve(), sys.argv[2]
    # --server-only: what depends on the server (the module's tarball and the
    # README's Install lines, the wheel against it); not the crate, npm, Maven
    # and Go installs, which are the same whatever the server.
    server_only = sys.argv[3:] == ["--server-only"]
    started = time.monotonic()
    tarball = one(dist, f"warden-{version}-*-glibc*.tar.gz")
    wheel = one(dist, f"warden_redis-{version}-py3-none-any.whl")
    one(dist, f"warden_redis-{version}.tar.gz")
    crate = one(dist, f"warden-client-{version}.crate")
    npm_tarball = one(dist, f"warden-redis-{version}.tgz")
    readme = (ROOT / "README.md").read_text()
    for name in (tarball.name, wheel.name, crate.name, npm_tarball.name):
        if name not in readme:
            fail(f"README.md does not name {name} (the artefact make dist built)")
    blocks = install_blocks()
    shell_blocks = [code for options, code in blocks if "as" not in options]
    manifests = [code for options, code in blocks if options.get("as") == "Cargo.toml"]
    if len(shell_blocks) < 2 or len(manifests) != 1:
        fail("README's Install section: expected the module's and pip's blocks, and one Cargo.toml")

    with tarfile.open(tarball) as t:
        names = sorted(t.getnames())
    top = tarball.name.removesuffix(".tar.gz")
    files = ("LICENSE", "README.md", "libwarden.so", "redis.conf.example")
    want = [top] + [f"{top}/{f}" for f in files]
    if names != want:
        fail(f"{tarball.name} holds {names}, expected {want}")

    scratch = Path(tempfile.mkdtemp(prefix="warden-dist-"))
    server_bin = os.environ.get("WARDEN_SERVER", "redis-server")
    port = free_port()
    env = dict(os.environ)
    venv = scratch / "venv"
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    # `pip install warden-redis` as written, from dist/ alone; whatever pip
    # takes from the registry, at python/constraints.txt's pins.
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(dist), PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_CONSTRAINT=str(ROOT / "python/constraints.txt"))
    # The README's blocks run where the artefacts are, as after a download.
    for artefact in (tarball, wheel, crate, npm_tarball):
        shutil.copy(artefact, scratch)
    pidfile = scratch / "redis.pid"
    # redis-server in the background on the test port, answering before the
    # next line runs; redis-cli talks to it.
    prelude = (
        f"redis-server() {{ command {shlex.quote(server_bin)} \"$@\" --port {port} "
        f"--bind 127.0.0.1 --dir {scratch} --daemonize yes --pidfile {pidfile} "
        f"--logfile {scratch / 'redis.log'} --warden.grace 0 && "
        f"for _ in $(seq 600); do command redis-cli -p {port} PING >/dev/null 2>&1 && return; "
        f"sleep 0.05; done; cat {scratch / 'redis.log'}; return 1; }}\n"
        f"redis-cli() {{ command redis-cli -p {port} \"$@\"; }}\n"
    )
    try:
        # A fresh venv with redis-py (the wheel's one dependency) at its pin.
        run([sys.executable, "-m", "venv", str(venv)])
        run([venv / "bin/pip", "install", "-q", "redis"], env={**env, "PIP_NO_INDEX": ""})
        for code in shell_blocks:
            out = run(["bash", "-euo", "pipefail", "-c", prelude + code], cwd=scratch, env=env)
            print(out.stdout, end="")
        cli = ["redis-cli", "-p", str(port)]

        def up() -> bool:
            ping = subprocess.run(cli + ["PING"], capture_output=True, text=True)
            return ping.stdout.strip() == "PONG"

        wait_for("the server from the tarball", up)
        modules = run(cli + ["MODULE", "LIST"]).stdout
        so = run(cli + ["CONFIG", "GET", "dir"]).stdout
        if "warden" not in modules:
            fail(f"warden is not loaded: {modules} {so}")
        info = run(cli + ["INFO", "warden"]).stdout
        if f"warden_version:{version}" not in info:
            fail(f"INFO warden does not say {version}:\n{info}")

        # The wheel, from the venv (not the checkout), against that server.
        smoke = f"""
import os, redis, warden
assert warden.__version__ == {version!r}, warden.__version__
assert "{venv}" in warden.__file__, warden.__file__
r = redis.Redis(port={port})
with r.lock("dist:lock", timeout=10, blocking_timeout=5, lock_class=warden.Lock) as lock:
    assert lock.fence > 0
loads = []
cache = warden.Cache(r, serializer=warden.TextSerializer())
for _ in range(2):
    assert cache.get_or_load("dist:cache", lambda: loads.append(1) or "v", ttl=60) == "v"
assert loads == [1], loads
print("python: warden-redis", warden.__version__, "from the wheel: lock and cache ok")
"""
        print(run([venv / "bin/python", "-c", smoke], cwd=scratch, env=env).stdout, end="")

        if server_only:
            print("dist-test --server-only: the crate, npm, Maven and Go installs ran on SERVER=redis")
            return
        # The crate, unpacked, as the dependency the README's Cargo.toml names.
        # Both in target/dist-smoke, at paths that stay put: cargo keeps what
        # it built there, so a later run recompiles only what changed.
        smoke_dir = ROOT / "target/dist-smoke"
        unpacked = smoke_dir / f"warden-client-{version}"
        project = smoke_dir / "project"
        shutil.rmtree(unpacked, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)
        with tarfile.open(crate) as t:
            # The "data" filter where this Python has it (3.11.4, 3.12, backports).
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            t.extractall(smoke_dir, **safe)
        (project / "src").mkdir(parents=True)
        (project / "Cargo.toml").write_text(
            '[package]\nname = "warden-dist-smoke"\nversion = "0.0.0"\nedition = "2021"\n'
            "publish = false\n\n"
            + manifests[0]
            + f'\n[patch.crates-io]\nwarden-client = {{ path = "{unpacked}" }}\n\n[workspace]\n'
        )
        # The workspace's Cargo.lock: the crates the project shares with it
        # stay at their pins (cargo only drops what the project does not use
        # and adds the project itself); checked below.
        shutil.copy(ROOT / "Cargo.lock", project / "Cargo.lock")
        shutil.copy(unpacked / "examples/readme.rs", project / "src/main.rs")
        cargo_env = {**os.environ, "CARGO_TARGET_DIR": str(smoke_dir)}
        out = run(["cargo", "run", "-q"], cwd=project,
                  env={**cargo_env, "REDIS_URL": f"redis://127.0.0.1:{port}/"})
        if "written with fence" not in out.stdout:
            fail(f"the crate's readme example printed:\n{out.stdout}")
        unlocked = crates(project / "Cargo.lock") - crates(ROOT / "Cargo.lock")
        if unlocked:
            fail("the crate's build took crates Cargo.lock does not pin: " + ", ".join(sorted(unlocked)))
        print(f"rust: warden-client {version} from the .crate: {out.stdout.splitlines()[0]}")

        node_test(npm_tarball, scratch, port)
        java_test(dist, version, port)
        go_test(dist, version, port)
    finally:
        if pidfile.exists():
            pid = int(pidfile.read_text())
            os.kill(pid, 15)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.05)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"dist-test: every artefact installed and ran ({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
