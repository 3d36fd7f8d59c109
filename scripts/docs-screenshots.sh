#!/usr/bin/env bash
# Screenshots of the built site in headless Chromium, one per kind of page:
#   scripts/docs-screenshots.sh <site dir> <out dir>
# (make docs-screenshots). The pages are opened from disk (the site uses
# plain .html URLs); --virtual-time-budget lets Mermaid render first.
set -euo pipefail
site=$(realpath "$1")
out=$2
mkdir -p "$out"
browser=$(command -v chromium || command -v chromium-browser)
# page:file name — the overview, a kind with a sequence diagram, failover
# with its timeline, a client, the benchmarks chart, the command reference.
for spec in index:overview cache:kind-cache failover:operating-failover \
	clients/python:client-python benchmarks:benchmarks commands:reference; do
	page=${spec%%:*}
	shot="$out/${spec##*:}.png"
	"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars \
		--user-data-dir="$(mktemp -d)" --window-size=1280,2400 \
		--virtual-time-budget=10000 --screenshot="$shot" "file://$site/$page.html" \
		>/dev/null 2>&1
	echo "$shot"
done
