#!/usr/bin/env bash
# Summarises the memcheck logs of `make valgrind`: every invalid read or write,
# and every definite leak whose stack passes through the module.
set -euo pipefail
dir=${1:-target/valgrind}
logs=("$dir"/*.log)
[ -e "${logs[0]}" ] || { echo "no valgrind logs in $dir"; exit 1; }
python3 - "$dir" <<'PY'
import glob, re, sys
bad = []
servers = 0
for path in glob.glob(sys.argv[1] + "/*.log"):
    servers += 1
    text = open(path, errors="replace").read()
    blocks = re.split(r"\n==\d+== \n", text)
    for b in blocks:
        if re.search(r"Invalid (read|write)|uninitialised|Mismatched free|Invalid free", b) and "libwarden" in b:
            bad.append((path, b))
        elif "definitely lost" in b and "libwarden" in b:
            bad.append((path, b))
print(f"valgrind: {servers} server runs checked, {len(bad)} problems in the module")
for path, b in bad[:10]:
    print(f"--- {path}\n{b}\n")
sys.exit(1 if bad else 0)
PY
