#!/usr/bin/env python3
"""Draws the overview dashboard's panels from a real run as one PNG.

    GRANARY_DASHBOARD_RESULTS=/tmp/overview.json \\
        build/debug/tests/monitoring/dashboards_test
    /usr/bin/python3 dashboards/render.py /tmp/overview.json docs/images/overview.png

tests/integration/dashboards_test.cc runs a real Prometheus over real cache nodes
and a sidecar during staging and training, evaluates each panel's query over
the run (query_range, 1 s steps) and writes the answers; this script lays the
panels out as Grafana would (gridPos, 24 columns) with matplotlib (Debian's
python3-matplotlib): time series as lines, stat/gauge panels as their last
value. It draws what Prometheus answered, nothing else.
"""

import json
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STATES = {"0": "idle", "1": "staging", "2": "complete", "3": "capacity", "4": "disk full",
          "5": "stopped"}
UNITS = {  # unit -> (divisor, suffix)
    "Bps": (1e6, " MB/s"), "bytes": (2 ** 20, " MiB"), "percentunit": (0.01, " %"),
    "s": (1e-3, " ms"), "ops": (1, " /s"), "reqps": (1, " req/s"), "short": (1, ""),
}


def legend(fmt, labels):
    if fmt in ("", "__auto"):
        return ",".join(f"{k}={v}" for k, v in labels.items() if k != "__name__") or "value"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def scaled(value, unit):
    div, _ = UNITS.get(unit, (1, ""))
    return value / div


def series_of(target):
    for s in target.get("range", []):
        times = [float(t) for t, _ in s["values"]]
        values = [float(v) for _, v in s["values"]]
        yield legend(target["legend"], s["metric"]), times, values


def draw_timeseries(ax, panel, start, end):
    unit = panel["unit"]
    drawn = 0
    for target in panel["targets"]:
        for name, times, values in series_of(target):
            ax.plot([t - start for t in times], [scaled(v, unit) for v in values], label=name,
                    linewidth=1.4)
            drawn += 1
    ax.set_xlabel("seconds into the run", fontsize=7)
    ax.set_ylabel(UNITS.get(unit, (1, unit))[1].strip(), fontsize=7)
    ax.tick_params(labelsize=7)
    ax.grid(alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, end - start)
    if drawn:
        ax.legend(fontsize=7, loc="upper right", framealpha=0.7)


def draw_stat(ax, panel):
    unit = panel["unit"]
    lines = []
    for target in panel["targets"]:
        # The value at the run's end (the range's last step), as Grafana shows a stat panel
        # opened then; the instant answer if the range is missing.
        # Series gone before the end (a staging state no share is in any more) are left out.
        ranged = [s for s in target.get("range", []) if s["values"]]
        last = max((float(s["values"][-1][0]) for s in ranged), default=0)
        answers = [{"metric": s["metric"], "value": s["values"][-1]} for s in ranged
                   if float(s["values"][-1][0]) >= last - 1.5] or target["instant"]
        for s in answers:
            labels = s["metric"]
            value = float(s["value"][1])
            name = legend(target["legend"], labels)
            if "state" in labels:
                name = STATES.get(labels["state"], labels["state"])
            if math.isnan(value):
                text = "n/a"
            elif unit == "percentunit":
                text = f"{value * 100:.1f} %"
            elif unit in UNITS and unit != "short":
                text = f"{scaled(value, unit):.3g}{UNITS[unit][1]}"
            else:
                text = f"{value:,.0f}" if abs(value) >= 10 or value == int(value) else f"{value:.3g}"
            lines.append((name, text))
    ax.axis("off")
    n = max(len(lines), 1)
    for i, (name, text) in enumerate(lines):
        y = 1 - (i + 0.5) / n
        ax.text(0.5, y + 0.08 / n * 2, text, ha="center", va="center", fontsize=20 if n == 1 else 15,
                color="#1f6f3f", weight="bold", transform=ax.transAxes)
        ax.text(0.5, y - 0.22 / n * 2, name, ha="center", va="center", fontsize=8, color="#444",
                transform=ax.transAxes)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        results = json.load(f)
    overview = next(d for d in results["dashboards"] if d["uid"] == "granary-overview")
    panels = [p for p in overview["panels"] if p["type"] != "row"]
    # Grafana's rows (gridPos.y) are compacted: rows are dropped, heights kept.
    bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(18, bottom * 0.5))
    fig.suptitle(f"{overview['title']}: a real run (2 cache nodes, 1 sidecar, staging through a "
                 "10 MB/s source, 3 epochs read)", fontsize=12, weight="bold")
    grid = fig.add_gridspec(bottom, 24, hspace=8, wspace=3, top=0.95, bottom=0.04, left=0.03,
                            right=0.99)
    for p in panels:
        g = p["gridPos"]
        ax = fig.add_subplot(grid[g["y"]:g["y"] + g["h"], g["x"]:g["x"] + g["w"]])
        ax.set_title(p["title"], fontsize=9, loc="left", weight="bold")
        if p["type"] == "timeseries":
            draw_timeseries(ax, p, results["start"], results["end"])
        else:
            draw_stat(ax, p)
    fig.savefig(sys.argv[2], dpi=80)
    print("wrote", sys.argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())
