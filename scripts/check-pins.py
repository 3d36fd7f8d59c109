"""Checks that the named distributions, and every one they depend on, are
installed at the exact version the constraints file pins:

    python scripts/check-pins.py python/constraints.txt redis pytest ...

Run by the Python it checks (the Makefile's .venv/bin/python), after a
``pip install -c``: a dependency a new pin brings in, and that the file does
not list, would otherwise float to whatever the registry serves that day.
Distributions installed from a path (the editable warden-redis) are not
pinned, but what they depend on is.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

try:
    from packaging.requirements import Requirement
except ImportError:  # a venv with pip alone: pip carries its own copy
    from pip._vendor.packaging.requirements import Requirement


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: str) -> dict[str, str]:
    found = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+)", line)
            if not m:
                sys.exit(f"{path}: not an exact pin: {line!r}")
            found[canonical(m.group(1))] = m.group(2)
    return found


def from_path(dist: metadata.Distribution) -> bool:
    direct = dist.read_text("direct_url.json")
    return direct is not None and '"url": "file:' in direct


def main(path: str, names: list[str]) -> None:
    pinned = pins(path)
    wrong, seen = [], set()
    todo = [(canonical(n), set()) for n in names]
    while todo:
        name, extras = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            wrong.append(f"{name}: not installed")
            continue
        if not from_path(dist) and pinned.get(name) != dist.version:
            wrong.append(f"{name} {dist.version}: pinned at {pinned.get(name, 'nothing')}")
        for text in dist.requires or []:
            req = Requirement(text)
            env = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in env):
                todo.append((canonical(req.name), set(req.extras)))
    if wrong:
        sys.exit(f"not at the versions {path} pins:\n  " + "\n  ".join(sorted(wrong)))


if __name__ == "__main__":
    main(sys.argv[1], [a for a in sys.argv[2:] if not a.startswith("-")])
