#!/usr/bin/env python3
"""The headline comparisons as one small bar chart, from bench/results.

    scripts/docs-chart.py [out.svg]     (default docs/assets/comparisons.svg)

Reads the ratios `make bench` wrote (bench/results/latest.json and
semaphore.json) for the rows below and draws each as warden's advantage
(the ratio, or its inverse where less is better) on a log scale. Plain SVG
from the standard library: `make docs` runs it before every build, so the
chart always shows the committed results. A row missing from the results
fails the build instead of drawing an old number.
"""

import json
import math
import pathlib
import sys
from xml.sax.saxutils import escape

ROOT = pathlib.Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench/results"

# (results file, group, row name, label, True where fewer is better)
ROWS = [
    ("latest.json", "locks", "acquire+release pairs vs SET NX PX + Lua release (P16)",
     "lock + release vs SET NX PX + Lua release", False),
    ("latest.json", "contention", "hand-offs/s: WAIT vs 10 ms polling",
     "50 clients on one lock: WAIT vs 10 ms polling", False),
    ("semaphore.json", "semaphore", "acquisitions/s: SEM.ACQUIRE WAIT vs redis-semaphore sorted set",
     "semaphore vs redis-semaphore's algorithm in Lua", False),
    ("latest.json", "stampede", "loads per expiry: CACHE.GET WAIT vs plain cache-aside (target on CACHE.GET: 1)",
     "cache stampede: database loads per expiry", True),
    ("latest.json", "rwlock", "RWLOCK.READ+UNLOCK vs Redisson-style Lua (P16)",
     "read lock + unlock vs Redisson-style Lua", False),
    ("latest.json", "bloom", "BF.ADD vs RedisBloom (P16)",
     "BF.ADD vs RedisBloom 2.8", False),
]


def load(name):
    return json.loads((RESULTS / name).read_text())


def advantage(rows, group, name, fewer_is_better):
    for r in rows:
        if r["group"] == group and r["name"] == name:
            return 1 / r["ratio"] if fewer_is_better else r["ratio"]
    sys.exit(f"docs-chart: no row {group!r} / {name!r} in bench/results")


def main():
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/assets/comparisons.svg"
    files = {}
    bars = []
    for file, group, name, label, fewer in ROWS:
        rows = files.setdefault(file, load(file))
        bars.append((label, advantage(rows, group, name, fewer), file))

    label_w, plot_w, bar_h, gap, top = 330, 380, 22, 10, 34
    ticks = [1, 2, 5, 10, 20, 50]
    top_value = ticks[-1]

    def x(v):
        return label_w + plot_w * math.log10(max(v, 1)) / math.log10(top_value)

    height = top + len(bars) * (bar_h + gap) + 36
    width = label_w + plot_w + 70
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="13">',
        '<title>warden against what people run today (warden\'s advantage, log scale)</title>',
        f'<text x="{label_w}" y="18" font-weight="bold">warden\'s advantage (×, log scale; 1× = the same)</text>',
    ]
    axis_y = top + len(bars) * (bar_h + gap)
    for t in ticks:
        svg.append(f'<line x1="{x(t):.1f}" y1="{top - 6}" x2="{x(t):.1f}" y2="{axis_y}" stroke="#ccc"/>')
        svg.append(f'<text x="{x(t):.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#555">{t}×</text>')
    for i, (label, value, file) in enumerate(bars):
        y = top + i * (bar_h + gap)
        svg.append(f'<text x="{label_w - 10}" y="{y + bar_h * 0.7:.1f}" text-anchor="end">{escape(label)}</text>')
        w = max(x(value) - label_w, 2)
        svg.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_h}" fill="#c0392b">'
                   f'<title>{escape(label)}: {value:.2f}× (bench/results/{file})</title></rect>')
        svg.append(f'<text x="{label_w + w + 6:.1f}" y="{y + bar_h * 0.7:.1f}">{value:.2f}×</text>')
    svg.append(f'<text x="{label_w}" y="{height - 4}" fill="#555" font-size="11">'
               'from bench/results/latest.json and semaphore.json (make bench)</text>')
    svg.append("</svg>")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(svg) + "\n")
    print(f"docs-chart: {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")


if __name__ == "__main__":
    main()
