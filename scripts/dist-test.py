#!/usr/bin/env python3
"""Installs what `make dist` built, as a user would, and runs it.

    scripts/dist-test.py <dist dir> <version>

- the module: the README's Install block unpacks the tarball and starts
  redis-server with the tarball's redis.conf.example and libwarden.so;
- the Python package: the README's `pip install warden-redis`, into a fresh
  venv, from the wheel in dist/ alone (PIP_NO_INDEX, PIP_FIND_LINKS), then a
  lock and a cache read through it;
- the Rust crate: a scratch project whose Cargo.toml has the README's
  dependency lines, with `warden-client` patched to the unpacked .crate, runs
  the crate's own examples/readme.rs.

Blocks of README.md's Install section marked `<!-- test: install -->` are
run as written (`as=Cargo.toml`: the scratch project's dependencies), with
`redis-server` a shell function that keeps the server on a test port in a
scratch directory (and without the 41 s grace window of the shipped
configuration, which tests/production_config.rs checks). Servers take ports
from WARDEN_TEST_PORTS (`7700-7799`), else any free one; WARDEN_SERVER names
the server binary. Only the standard library: it runs before any venv.
"""

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


def wait_for(what: str, cond, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> None:
    dist, version = Path(sys.argv[1]).resolve(), sys.argv[2]
    started = time.monotonic()
    tarball = one(dist, f"warden-{version}-*-glibc*.tar.gz")
    wheel = one(dist, f"warden_redis-{version}-py3-none-any.whl")
    one(dist, f"warden_redis-{version}.tar.gz")
    crate = one(dist, f"warden-client-{version}.crate")
    readme = (ROOT / "README.md").read_text()
    for name in (tarball.name, wheel.name, crate.name):
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
    # `pip install warden-redis` as written, from dist/ alone.
    env.update(PIP_NO_INDEX="1", PIP_FIND_LINKS=str(dist), PIP_DISABLE_PIP_VERSION_CHECK="1")
    # The README's blocks run where the artefacts are, as after a download.
    for artefact in (tarball, wheel, crate):
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
        # A fresh venv with redis-py (the wheel's one dependency) at .venv's version.
        run([sys.executable, "-m", "venv", str(venv)])
        redis_py = os.environ.get("WARDEN_REDIS_PY", "redis>=5")
        run([venv / "bin/pip", "install", "-q", redis_py], env={**env, "PIP_NO_INDEX": ""})
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
        shutil.copy(ROOT / "Cargo.lock", project / "Cargo.lock")
        shutil.copy(unpacked / "examples/readme.rs", project / "src/main.rs")
        cargo_env = {**os.environ, "CARGO_TARGET_DIR": str(smoke_dir)}
        out = run(["cargo", "run", "-q"], cwd=project,
                  env={**cargo_env, "REDIS_URL": f"redis://127.0.0.1:{port}/"})
        if "written with fence" not in out.stdout:
            fail(f"the crate's readme example printed:\n{out.stdout}")
        print(f"rust: warden-client {version} from the .crate: {out.stdout.splitlines()[0]}")
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
