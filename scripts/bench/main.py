"""Entry point of the scale benchmark (issue 12): `bash scripts/bench.sh [chart] [flags]`.

Builds meshpilot (release), generates the mesh, runs each target (meshpilot, limit, istiod,
split) as separate processes against the same load client, and writes the report (JSON) and a
table; `chart` does that for several proxy counts and draws docs/bench/scale.svg."""

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import chart  # noqa: E402
import pilotload  # noqa: E402
from report import print_table  # noqa: E402
from run import TARGETS, run_all  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))


def parse_args(argv):
    """Options; opts.settings() is what the report records."""
    p = argparse.ArgumentParser(prog="bash scripts/bench.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["run", "chart"], default="run",
                   help="run (default): one run; chart: proxies 1k,2k,5k,10k, writes docs/bench/scale.{json,svg}")
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=10, help="endpoints per service")
    p.add_argument("--namespaces", type=int, default=20)
    p.add_argument("--vs-every", type=int, default=10, help="a VirtualService on every Nth service")
    p.add_argument("--dr-every", type=int, default=5, help="a DestinationRule on every Nth service")
    p.add_argument("--sidecar-scoping", choices=["on", "off"], default="on")
    p.add_argument("--proxies", type=int, default=1000)
    p.add_argument("--workloads", type=int, default=200)
    p.add_argument("--mode", choices=["sotw", "delta"], default="sotw")
    p.add_argument("--frontends", type=int, default=2, help="frontends of the split target (0: standalone only)")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma separated: " + ",".join(TARGETS))
    p.add_argument("--out", default=None, help="report JSON (default target/bench/scale.json)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds the client waits after each phase")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds of the edit phases; each figure of an edit is the median over the rounds")
    p.add_argument("--connect-rate", type=float, default=0.0, help="the client's new streams per second (0: all at once)")
    p.add_argument("--client-timeout", type=int, default=300, help="the load client's --timeout, seconds")
    p.add_argument("--phase-actions", choices=["hook", "direct"], default="hook",
                   help="hook (default): phases post to the bench, which samples CPU/metrics and then edits; "
                        "direct: the client's own write/post actions (no per-phase CPU)")
    p.add_argument("--istiod-max-proxies", type=int, default=5000,
                   help="skip istiod above this many proxies (it needs about 1.6 MB each; 0: never skip)")
    p.add_argument("--istiod-request-limit", type=float, default=1e6,
                   help="istiod's PILOT_MAX_REQUESTS_PER_SECOND (new xDS streams per second, burst 1): raised by "
                        "default so that it is not what is measured; 0 keeps istiod's own (15 + 5 x GOMAXPROCS)")
    p.add_argument("--pilot-load", action="store_true",
                   help="also drive meshpilot and istiod with pilot-load's adsc mode, where pilot-load exists")
    p.add_argument("--pilot-load-seconds", type=float, default=120.0)
    p.add_argument("--no-build", action="store_true", help="use the existing release build")
    p.add_argument("--meshpilot", default=None, help="the meshpilot binary (default: the release build)")
    p.add_argument("--workdir", default=None, help="meshes, logs, captures (default target/bench/work)")
    p.add_argument("--proxies-list", default="1000,2000,5000,10000", help="chart: proxy counts")
    p.add_argument("--chart-dir", default=os.path.join(REPO, "docs", "bench"), help="chart: where scale.* go")
    opts = p.parse_args(argv)
    opts.repo = REPO
    target_dir = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    opts.meshpilot = os.path.abspath(opts.meshpilot or os.path.join(target_dir, "release", "meshpilot"))
    opts.out = os.path.abspath(opts.out or os.path.join(target_dir, "bench", "scale.json"))
    opts.workdir = os.path.abspath(opts.workdir or os.path.join(target_dir, "bench", "work"))
    opts.targets = [t.strip() for t in opts.targets.split(",") if t.strip()]
    unknown = [t for t in opts.targets if t not in TARGETS]
    if unknown:
        p.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    for name in ("services", "endpoints", "namespaces", "proxies", "workloads"):
        if getattr(opts, name) < 1:
            p.error(f"--{name} must be at least 1")
    if opts.services < 2:
        p.error("--services must be at least 2 (the edits change two different services)")
    if not 1 <= opts.repeat <= 40:
        p.error("--repeat must be 1 to 40 (each round shifts the edited VirtualService's weights by one)")
    if (opts.services + opts.repeat + 1) * opts.endpoints >= 1 << 23:
        p.error("--services x --endpoints must stay below 8M: endpoints use 10.0.0.0-10.127.255.255")
    opts.command_line = "bash scripts/bench.sh " + " ".join(shlex.quote(a) for a in argv)

    def settings():
        keys = ["services", "endpoints", "namespaces", "vs_every", "dr_every", "sidecar_scoping", "proxies",
                "workloads", "mode", "frontends", "targets", "settle", "connect_rate", "client_timeout", "phase_actions",
                "istiod_request_limit", "repeat"]
        return {k: getattr(opts, k) for k in keys}

    opts.settings = settings
    return opts


def build(opts):
    """`cargo build --release --locked --bins`; exits on failure."""
    print("== building meshpilot (cargo build --release --locked --bins)", flush=True)
    r = subprocess.run(["cargo", "build", "--release", "--locked", "--bins"], cwd=REPO)
    if r.returncode != 0:
        sys.exit(f"cargo build failed (exit {r.returncode})")


def write_json(path, data):
    """Writes data as indented JSON, creating the directory."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, sort_keys=False)
        f.write("\n")


def one_run(opts):
    """One run of every target: report written to opts.out and printed."""
    report = run_all(opts)
    report["command"] = opts.command_line
    write_json(opts.out, report)
    print_table(report)
    if opts.pilot_load and not report.get("pilot_load", {}).get("available"):
        print(f"pilot-load: not run: {report['pilot_load'].get('why')}")
    print(f"report: {opts.out}")
    return report


def chart_point(report, proxies):
    """The chart's figures of one run."""
    targets = {}
    for name, r in report["targets"].items():
        f = r.get("figures") or {}
        measured = r["status"] in ("ok", "incomplete")
        targets[name] = {
            "status": r["status"],
            "initial_seconds": ((f.get("phases") or {}).get("initial") or {}).get("seconds") if measured else None,
            "rss_after_initial_mb": f.get("rss_after_initial_mb") if measured else None,
            "rss_per_proxy_kb": f.get("rss_per_proxy_kb") if measured else None,
            "error": (r.get("error") or "").splitlines()[0] if r.get("error") else None,
        }
    return {"proxies": proxies, "targets": targets}


def chart_runs(opts):
    """A run per proxy count; docs/bench/scale.json and scale.svg."""
    counts = [int(x) for x in opts.proxies_list.split(",") if x.strip()]
    points, base = [], opts.out
    report = None
    for n in counts:
        opts.proxies = n
        opts.out = base.replace(".json", f"-{n}.json")
        print(f"\n######## chart: {n} proxies", flush=True)
        report = one_run(opts)
        points.append(chart_point(report, n))
    summary = {
        "command": opts.command_line,
        "date": report["date"],
        "machine": report["machine"],
        "git": report["git"],
        "settings": {k: v for k, v in opts.settings().items() if k != "proxies"},
        "proxies": counts,
        "load_client_missing_flags": report.get("load_client_missing_flags", []),
        "points": points,
    }
    out_json = os.path.join(opts.chart_dir, "scale.json")
    write_json(out_json, summary)
    out_svg = os.path.join(opts.chart_dir, "scale.svg")
    with open(out_svg, "w") as f:
        f.write(chart.svg(points, chart.caption(summary)))
    print(f"chart: {out_json}, {out_svg}")


def interrupt(signum, _frame):
    """SIGTERM/SIGHUP as Ctrl-C: every target's `with ProcGroup` stops its processes."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv):
    """Runs what the command line asks; exit 1 if any requested target failed or was incomplete."""
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    opts = parse_args(argv)
    if not opts.no_build:
        build(opts)
    if not os.path.isfile(opts.meshpilot):
        sys.exit(f"meshpilot binary not found at {opts.meshpilot} (build it, or drop --no-build)")
    if opts.pilot_load and not pilotload.status()["available"]:
        print(f"pilot-load: {pilotload.status()['why']}", flush=True)
    try:
        if opts.command == "chart":
            chart_runs(opts)
            return 0
        report = one_run(opts)
    except KeyboardInterrupt:
        print("interrupted: every process started was stopped", file=sys.stderr)
        return 130
    failed = [n for n, r in report["targets"].items() if r["status"] in ("failed", "incomplete")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
