"""Draws bench/results/latest.json as a bar chart of ratios (bench/results/ratios.png)."""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

here = pathlib.Path(__file__).parent / "results"
rows = [r for r in json.loads((here / "latest.json").read_text()) if r["ratio"] > 0]
names = [r["name"] for r in rows]
ratios = [r["ratio"] for r in rows]
colors = [{"met": "#3a7", "MISSED": "#d54"}.get(r["verdict"], "#89a") for r in rows]

fig, ax = plt.subplots(figsize=(11, 0.32 * len(rows) + 1.5))
ax.barh(range(len(rows)), ratios, color=colors)
ax.set_yticks(range(len(rows)))
ax.set_yticklabels(names, fontsize=7)
ax.invert_yaxis()
ax.set_xscale("log")
ax.axvline(1.0, color="black", linewidth=0.8)
for i, r in enumerate(rows):
    if r["target"] is not None:
        ax.plot([r["target"]] * 2, [i - 0.4, i + 0.4], color="black", linewidth=1.5)
ax.set_xlabel(
    "warden / comparison (log scale; black ticks: ratio targets; green: target met, red: missed, "
    "grey: no target)"
)
ax.set_title("warden vs what users run today")
fig.tight_layout()
fig.savefig(here / "ratios.png", dpi=110)
print(f"chart: {here / 'ratios.png'}")
