#!/usr/bin/env python3
"""Lays out a Go module as a GOPROXY directory.

    scripts/go-proxy.py <module dir> <version> <out dir>

Writes <out>/<module path>/@v/v<version>.{zip,mod,info} and `list` for the
module in <module dir> (its files tracked by git, under the zip's
`<path>@v<version>/` prefix), then copies from the module cache (`go mod
download -json`) the .info, .mod and .zip of every module in the module's
graph (`go mod graph`), so that `GOPROXY=file://<out> go get <path>@v<version>`
needs nothing else. Only the standard library and the go command.
"""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from datetime import datetime, timezone
from pathlib import Path


def escape(path: str) -> str:
    """The module proxy's case encoding: an upper-case letter becomes ! and its lower case."""
    return "".join("!" + c.lower() if c.isupper() else c for c in path)


def add(out: Path, path: str, version: str, info: str, mod: str, zip_file: str) -> None:
    d = out / escape(path) / "@v"
    d.mkdir(parents=True, exist_ok=True)
    for src, ext in ((info, "info"), (mod, "mod"), (zip_file, "zip")):
        if src and Path(src).exists():
            shutil.copyfile(src, d / f"{version}.{ext}")
    versions = set((d / "list").read_text().split()) if (d / "list").exists() else set()
    versions.add(version)
    (d / "list").write_text("".join(v + "\n" for v in sorted(versions)))


def main() -> None:
    moddir, version, out = Path(sys.argv[1]).resolve(), "v" + sys.argv[2], Path(sys.argv[3]).resolve()
    shutil.rmtree(out, ignore_errors=True)
    gomod = (moddir / "go.mod").read_text()
    path = next(line.split()[1] for line in gomod.splitlines() if line.startswith("module "))

    # The dependencies, from the module cache.
    graph = subprocess.run(["go", "mod", "graph"], cwd=moddir, check=True, capture_output=True, text=True).stdout
    mods = sorted({m for m in graph.split() if "@" in m and m.split("@")[0] not in ("go", "toolchain")})
    if mods:
        res = subprocess.run(["go", "mod", "download", "-json", *mods], cwd=moddir, check=True,
                             capture_output=True, text=True).stdout
        dec = json.JSONDecoder()
        i = 0
        while i < len(res):
            if res[i].isspace():
                i += 1
                continue
            m, i = dec.raw_decode(res, i)
            if m.get("Error"):
                sys.exit(f"go mod download {m['Path']}@{m['Version']}: {m['Error']}")
            add(out, m["Path"], m["Version"], m.get("Info", ""), m.get("GoMod", ""), m.get("Zip", ""))

    # The module itself: its tracked files under the zip's prefix.
    files = subprocess.run(["git", "ls-files", "-z", "."], cwd=moddir, check=True,
                           capture_output=True).stdout.decode().split("\0")
    # A directory with its own go.mod (go/bench) is another module: the go command refuses a zip
    # that holds it ("go.mod file not in module root directory").
    nested = [f[: -len("go.mod")] for f in files if f.endswith("/go.mod")]
    files = [f for f in files if f and not any(f.startswith(n) for n in nested)]
    d = out / escape(path) / "@v"
    d.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(d / f"{version}.zip", "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(files):
            z.write(moddir / f, f"{path}@{version}/{f}")
    shutil.copyfile(moddir / "go.mod", d / f"{version}.mod")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    (d / f"{version}.info").write_text(json.dumps({"Version": version, "Time": stamp}) + "\n")
    (d / "list").write_text(version + "\n")
    print(f"{out}: {path}@{version} and {len(mods)} module versions it depends on")


if __name__ == "__main__":
    main()
