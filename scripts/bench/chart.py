"""A hand-written SVG chart of the `chart` runs: initial convergence seconds and RSS MB (after
initial convergence) against proxies, one line per server, two panels side by side."""

import math
import sys
from xml.sax.saxutils import escape

COLORS = {"meshpilot": "#1f77b4", "limit": "#2ca02c", "istiod": "#d62728", "split": "#9467bd"}
FALLBACK = ["#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f"]


def series(points, key):
    """{target: [(proxies, value, complete)]} from chart points ({'proxies', 'targets': {name:
    {key: v, 'status': s}}}); complete is False for an 'incomplete' run."""
    out = {}
    for p in points:
        for name, figs in p["targets"].items():
            v = figs.get(key)
            if v is not None:
                out.setdefault(name, []).append((p["proxies"], v, figs.get("status") != "incomplete"))
    return {k: sorted(v) for k, v in out.items()}


def nice_max(v):
    """A round number >= v for the top of an axis."""
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def panel(x0, y0, w, h, title, unit, data, xs):
    """SVG elements of one panel: axes (x log scale over xs), grid, one polyline per target."""
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-size="14" font-weight="bold">'
           f'{escape(title)}</text>']
    ymax = nice_max(max((v for pts in data.values() for _, v, _ in pts), default=1.0))
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    span = hi - lo or 1.0
    px = lambda x: x0 + (math.log10(x) - lo) / span * w  # noqa: E731
    py = lambda y: y0 + h - y / ymax * h  # noqa: E731
    out.append(f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
    for k in range(6):
        y = ymax * k / 5
        out.append(f'<line x1="{x0}" y1="{py(y):.1f}" x2="{x0 + w}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(y) + 4:.1f}" text-anchor="end" font-size="11">{y:g}</text>')
    for x in xs:
        out.append(f'<line x1="{px(x):.1f}" y1="{y0}" x2="{px(x):.1f}" y2="{y0 + h}" stroke="#eee"/>')
        label = f"{x / 1000:g}k" if x >= 1000 else str(x)
        out.append(f'<text x="{px(x):.1f}" y="{y0 + h + 16}" text-anchor="middle" font-size="11">{label}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 34}" text-anchor="middle" font-size="12">proxies</text>')
    out.append(f'<text x="{x0 - 42}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 42} {y0 + h / 2})">{escape(unit)}</text>')
    for i, (name, pts) in enumerate(sorted(data.items())):
        color = COLORS.get(name, FALLBACK[i % len(FALLBACK)])
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y, _ in pts)
        out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, complete in pts:
            fill = color if complete else "white"
            note = "" if complete else " (not every proxy converged)"
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="{3 if complete else 4}" fill="{fill}" '
                       f'stroke="{color}" stroke-width="2"><title>{escape(name)}: {y:.3g} {escape(unit)} at {x} '
                       f'proxies{note}</title></circle>')
    return out


def caption(summary):
    """The lines under the chart: the command that made it, when, where, and the settings."""
    git, m, st = summary["git"], summary["machine"], summary["settings"]
    commit = (git.get("commit") or "?")[:12] + (" (dirty)" if git.get("dirty") else "")
    lines = [
        f"made by: {summary['command']}",
        f"{summary['date']}, commit {commit}, {m['nproc']} cpus {m['cpu_model']}",
        f"{st['services']} services x {st['endpoints']} endpoints, {st['namespaces']} namespaces, sidecar scoping "
        f"{st['sidecar_scoping']}, {st['mode']}, split = {st['frontends']} frontends; hollow: not every proxy "
        f"converged within {st['client_timeout']} s",
    ]
    if summary.get("load_client_missing_flags"):
        lines.append("load client without " + ", ".join(summary["load_client_missing_flags"]) +
                     " (initial convergence only; no limit target)")
    return lines


def svg(points, caption_lines):
    """The whole chart as SVG text."""
    xs = sorted({p["proxies"] for p in points}) or [1]
    conv = series(points, "initial_seconds")
    rss = series(points, "rss_after_initial_mb")
    names = sorted(set(conv) | set(rss))
    width, height = 960, 490
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
           f'<rect width="{width}" height="{height}" fill="white"/>']
    out += panel(80, 50, 340, 280, "Initial convergence", "seconds", conv, xs)
    out += panel(560, 50, 340, 280, "Server RSS after initial convergence", "MB", rss, xs)
    for i, name in enumerate(names):
        color = COLORS.get(name, FALLBACK[i % len(FALLBACK)])
        x = 80 + i * 150
        out.append(f'<line x1="{x}" y1="392" x2="{x + 24}" y2="392" stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{x + 30}" y="396" font-size="12">{escape(name)}</text>')
    for i, line in enumerate(caption_lines):
        out.append(f'<text x="20" y="{425 + i * 16}" font-size="11" fill="#555">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    """`python3 scripts/bench/chart.py SCALE.json [OUT.svg]`: redraws a chart from its JSON."""
    import json

    if not argv:
        sys.exit("usage: chart.py SCALE.json [OUT.svg]")
    with open(argv[0]) as f:
        summary = json.load(f)
    out = argv[1] if len(argv) > 1 else argv[0][: -len(".json")] + ".svg"
    with open(out, "w") as f:
        f.write(svg(summary["points"], caption(summary)))
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
