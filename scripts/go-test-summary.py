#!/usr/bin/env python3
"""Reads `go test -json` on stdin, prints the tests' output as go test would,
and closes with `# pass N` and `# fail N` (the lines .ci/run adds up).

Counted: every test, subtest and Example function that ended `pass` or
`fail` (an event with a Test name), once each; skipped ones count in neither.
A package that failed without a failing test (a build error, a panic in
TestMain, goleak) counts as one failure. Exits non-zero when anything failed.
"""

import json
import sys


def main() -> int:
    passed = failed = 0
    failed_tests = set()
    bad_packages = set()
    for line in sys.stdin:
        try:
            ev = json.loads(line)
        except ValueError:
            print(line, end="")  # build errors come as plain text
            continue
        action, test, pkg = ev.get("Action"), ev.get("Test"), ev.get("Package", "")
        if action == "output":
            print(ev.get("Output", ""), end="")
        elif action == "pass" and test:
            passed += 1
        elif action == "fail" and test:
            failed += 1
            failed_tests.add(pkg)
        elif action == "fail":
            bad_packages.add(pkg)
    # A package that failed with no failing test of its own.
    failed += len(bad_packages - failed_tests)
    print(f"# pass {passed}")
    print(f"# fail {failed}")
    return 1 if failed or bad_packages else 0


if __name__ == "__main__":
    sys.exit(main())
