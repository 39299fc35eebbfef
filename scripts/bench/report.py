"""Figures of one target from its samples and the load client's report; the issue's targets
(pass/fail), ratios to the limit and to istiod; the machine; the printed table."""

import datetime
import mmap
import os
import statistics
import subprocess
import time

from measure import build_ms, delta, interesting, pick
from mesh import PHASES, parse_phase

MB = 1024.0 * 1024.0


def machine():
    """nproc, CPU model, MemTotal."""
    model, mem = None, None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
        with open("/proc/meminfo") as f:
            mem = next((int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:")), None)
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu_model": model, "mem_total_bytes": mem, "memory": memory_probe()}


def memory_probe(mib=64, idle_s=5.0):
    """Microseconds per 4 KiB page: a first touch (fault), a read right after (warm), and a read
    after `idle_s` seconds untouched (cold). On a virtual machine whose host reclaims idle guest
    memory the cold read costs tens of microseconds: any figure that walks memory untouched since
    the last edit (a snapshot build, a push) then pays it, for meshpilot and the references alike."""
    size, page = mib << 20, 4096
    try:
        m = mmap.mmap(-1, size)
    except (OSError, ValueError):
        return None
    try:
        if hasattr(m, "madvise") and hasattr(mmap, "MADV_NOHUGEPAGE"):
            m.madvise(mmap.MADV_NOHUGEPAGE)
        pages = range(0, size, page)

        def per_page(touch):
            t = time.perf_counter()
            for i in pages:
                touch(i)
            return round((time.perf_counter() - t) * 1e6 / len(pages), 3)

        def write(i):
            m[i] = 1

        fault = per_page(write)
        warm = per_page(m.__getitem__)
        time.sleep(idle_s)
        cold = per_page(m.__getitem__)
        return {"fault_us_per_page": fault, "warm_read_us_per_page": warm,
                "cold_read_us_per_page": cold, "idle_s": idle_s, "mib": mib}
    finally:
        m.close()


def git_state(repo):
    """{'commit': HEAD, 'dirty': bool} of repo (None when git does not answer)."""
    def run(*args):
        r = subprocess.run(["git", "-C", repo, *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": run("rev-parse", "HEAD"), "dirty": None if status is None else bool(status)}


def utc_now():
    """The date and time, UTC, ISO 8601."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sum(sample, roles, key):
    """Sum of key over roles in one sample (None if any is missing)."""
    total = 0.0
    for r in roles:
        p = (sample or {}).get("procs", {}).get(r)
        if p is None:
            return None
        total += p[key]
    return total


def _interval_labels(sampler):
    """[(phase name, start sample, end sample)]: 'initial' from 'before load' to the next
    sample, then each edit phase to the next sample (the last to 'end')."""
    out = []
    samples = sampler.samples
    for k, s in enumerate(samples[:-1]):
        if s["label"] == "before load":
            name = "initial"
        elif s["label"].startswith("before "):
            name = s["label"][len("before "):]
        else:
            continue
        out.append((name, s, samples[k + 1]))
    return out


def client_phase(report, name):
    """The load client's entry for phase name (list of {name, ...} or {name: {...}})."""
    phases = (report or {}).get("phases")
    if isinstance(phases, dict):
        return phases.get(name)
    for p in phases or []:
        if isinstance(p, dict) and p.get("name") == name:
            return p
    return None


def figures(sampler, running, client, proxies):
    """Everything measured of one target: memory, CPU per phase (per role and summed), build
    times and metric deltas per phase, and the client's latencies and bytes."""
    roles = list(running.servers)
    intervals = _interval_labels(sampler)
    before = sampler.get("before load")
    after_initial = intervals[0][2] if intervals else None
    end = sampler.samples[-1] if sampler.samples else None
    # Memory figures are the control plane's: split's Envoy load balancer is listed by role only.
    mem_roles = [r for r in roles if not r.startswith("lb-")]
    rss0, rss1 = _sum(before, mem_roles, "rss"), _sum(after_initial, mem_roles, "rss")
    connected = pick(client, "connected") or proxies
    f = {
        "roles": roles,
        "support": list(running.support),
        "rss_before_mb": rss0 / MB if rss0 is not None else None,
        "rss_after_initial_mb": rss1 / MB if rss1 is not None else None,
        "memory_roles": mem_roles,
        "rss_peak_mb": (_sum(end, mem_roles, "hwm") or 0) / MB if end else None,
        "rss_per_proxy_kb": (rss1 - rss0) / connected / 1024.0 if None not in (rss0, rss1) and connected else None,
        "by_role": {},
        "phases": {},
    }
    # The full build happens at start, before the server is ready: the counters' totals at
    # 'before load' (they start at 0 with the process).
    full = [build_ms(m, {}) for m in (before or {}).get("metrics", {}).values()]
    full = [(ms, n) for ms, n in full if n]
    f["full_build_ms"] = full[0][0] if full else None
    f["full_builds"] = full[0][1] if full else 0
    for r in list(running.servers) + list(running.support):
        b, a, e = [((s or {}).get("procs") or {}).get(r) for s in (before, after_initial, end)]
        f["by_role"][r] = {
            "measured": r in running.servers,
            "rss_before_mb": b["rss"] / MB if b else None,
            "rss_after_initial_mb": a["rss"] / MB if a else None,
            "rss_peak_mb": e["hwm"] / MB if e else None,
            "cpu": {},
        }
    for name, s0, s1 in intervals:
        ph = {"cpu_s": None, "build_ms": None, "builds": 0, "metrics": {}}
        c0, c1 = _sum(s0, roles, "cpu"), _sum(s1, roles, "cpu")
        if None not in (c0, c1):
            ph["cpu_s"] = c1 - c0
        for r in f["by_role"]:
            p0, p1 = s0["procs"].get(r), s1["procs"].get(r)
            if p0 and p1:
                f["by_role"][r]["cpu"][name] = p1["cpu"] - p0["cpu"]
        for role, m1 in s1["metrics"].items():
            m0 = s0["metrics"].get(role, {})
            ms, n = build_ms(m1, m0)
            if n:
                ph["build_ms"], ph["builds"] = ms, ph["builds"] + n
            d = {k: v for k, v in delta(interesting(m1), interesting(m0)).items() if v}
            if d:
                ph["metrics"][role] = d
        ph.update(client_figures(client, name))
        f["phases"][name] = ph
    # Phases the bench did not see begin (`--phase-actions direct`): the client's figures only,
    # and the initial interval's CPU and metrics span the whole run.
    for p in (client or {}).get("phases") or []:
        name = p.get("name") if isinstance(p, dict) else None
        if name and name not in f["phases"]:
            f["phases"][name] = client_figures(client, name)
            if "initial" in f["phases"]:
                f["phases"]["initial"]["interval"] = "the whole run (phases not sampled separately)"
    return f


def client_figures(client, name):
    """Latencies (ms) and bytes of one phase ('initial' or an edit) from the client's report."""
    c = (client or {}).get("initial") if name == "initial" else client_phase(client, name)
    if not isinstance(c, dict):
        if name == "initial" and client:
            c = client  # the old client's flat report: p50_seconds, p99_seconds, max_seconds
        else:
            return {}
    out = {
        "seconds": pick(c, "seconds", "max_seconds", "max"),
        "p50_ms": pick(c, "p50_ms", "p50_seconds", "p50"),
        "p99_ms": pick(c, "p99_ms", "p99_seconds", "p99"),
        "max_ms": pick(c, "max_ms", "max_seconds", "max"),
        "pushed": pick(c, "pushed"),
        "responses": pick(c, "responses"),
        "bytes_total": pick(c, "bytes_total"),
        "bytes_per_proxy": pick(c, "bytes_per_pushed_proxy", "bytes_per_proxy"),
        "bytes_max_per_proxy": pick(c, "bytes_per_proxy_max", "bytes_max_per_proxy"),
        "timed_out": c.get("timed_out") or None,
        "error": c.get("error") or None,
    }
    for k in ("p50_ms", "p99_ms", "max_ms"):  # pick() gives seconds
        if out[k] is not None:
            out[k] *= 1000.0
    return {k: v for k, v in out.items() if v is not None}


def _rounds(f, name, key):
    """The values of `key` in each round of phase `name` (just 'initial' for it), in run order.
    A round that pushed no proxy has no latency (its change went out with a later phase, as
    istiod's debounce sometimes does): it is left out of the latencies, not counted as 0 ms; the
    round's "proxies pushed" row shows it."""
    phases = (f or {}).get("phases", {})
    names = [n for n in phases if parse_phase(n)[0] == name]
    rounds = [phases.get(n) or {} for n in sorted(names, key=lambda n: parse_phase(n)[1])]
    if key.endswith("_ms"):
        rounds = [r for r in rounds if r.get("pushed") != 0]
    return [r.get(key) for r in rounds if r.get(key) is not None]


# (figure label, getter, absolute limit or None, limit multiple or None); lower is better. An
# edit's figure is its median over the rounds (`--repeat`): one edit on this shared machine varies
# by tens of percent from run to run, for the limit as much as for meshpilot.
def _ph(name, key):
    return lambda f: statistics.median(_rounds(f, name, key)) if _rounds(f, name, key) else None


def _exact(name, key):
    return lambda f: ((f or {}).get("phases", {}).get(name) or {}).get(key)


CHECKS = [
    ("initial convergence s", _ph("initial", "seconds"), None, 1.25),
    ("endpoint-change p99 ms", _ph("endpoint-change", "p99_ms"), 250.0, None),
    ("endpoint-change bytes/proxy", _ph("endpoint-change", "bytes_per_proxy"), 8192.0, None),
    ("vs-edit p99 ms", _ph("vs-edit", "p99_ms"), None, 1.5),
    ("dr-edit p99 ms", _ph("dr-edit", "p99_ms"), None, None),
    ("new-service p99 ms", _ph("new-service", "p99_ms"), None, None),
    ("RSS per proxy KB", lambda f: f.get("rss_per_proxy_kb"), 256.0, None),
    ("RSS after initial MB", lambda f: f.get("rss_after_initial_mb"), None, None),
    ("CPU initial s", _ph("initial", "cpu_s"), None, None),
    ("snapshot build full ms", lambda f: f.get("full_build_ms"), 100.0, None),
    ("snapshot build vs-edit ms", _ph("vs-edit", "build_ms"), 5.0, None),
    ("snapshot build dr-edit ms", _ph("dr-edit", "build_ms"), 5.0, None),
    ("snapshot build endpoint-change ms", _ph("endpoint-change", "build_ms"), 5.0, None),
    ("snapshot build new-service ms", _ph("new-service", "build_ms"), 5.0, None),
]


def checks(results, importers=None):
    """For meshpilot and split: each figure, its target's pass/fail, and its ratio to the
    limit and to istiod (and whether it is ahead of istiod), from the same run; and for each
    edit, whether exactly the proxies importing the edited object were pushed (`importers`)."""
    def fig(name):
        r = results.get(name) or {}
        return r.get("figures") if r.get("status") in ("ok", "incomplete") else None

    limit, istiod = fig("limit"), fig("istiod")
    out = {}
    for target in ("meshpilot", "split"):
        f = fig(target)
        if not f:
            continue
        rows = []
        for label, get_value, absolute, multiple in CHECKS:
            v = get_value(f)
            lv = get_value(limit) if limit else None
            iv = get_value(istiod) if istiod else None
            row = {"figure": label, "value": v, "limit": lv, "istiod": iv}
            phase = label.split()[0]
            if phase in PHASES and label.endswith(" p99 ms"):
                # Each round's p99, beside the medians compared.
                row["rounds"] = {who: _rounds(figs, phase, "p99_ms")
                                 for who, figs in (("value", f), ("limit", limit), ("istiod", istiod))}
            # Ratios only of positive figures (an RSS growth may be negative: a Go GC ran).
            row["vs_limit"] = v / lv if v is not None and lv and v > 0 and lv > 0 else None
            row["vs_istiod"] = v / iv if v is not None and iv and v > 0 and iv > 0 else None
            row["ahead_of_istiod"] = (v < iv) if row["vs_istiod"] is not None else None
            if absolute is not None:
                row["target"] = f"<= {absolute:g}"
                row["pass"] = v <= absolute if v is not None else None
            elif multiple is not None:
                row["target"] = f"<= {multiple:g}x limit"
                row["pass"] = v <= multiple * lv if v is not None and lv else None
            rows.append(row)
        for phase, expected in (importers or {}).items():
            v = _exact(phase, "pushed")(f)
            iv = _exact(phase, "pushed")(istiod) if istiod else None
            rows.append({"figure": f"{phase} proxies pushed", "value": v, "limit": None, "istiod": iv,
                         "vs_limit": None, "vs_istiod": None, "ahead_of_istiod": None,
                         "target": f"= {expected} importing", "pass": v == expected if v is not None else None})
        out[target] = {
            "incomplete": [n for n in (target, "limit", "istiod") if (results.get(n) or {}).get("status") == "incomplete"],
            "rows": rows,
        }
    return out


def _fmt(v, digits=2):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _verdict(v):
    return {True: "PASS", False: "FAIL", None: ""}[v]


def print_table(report):
    """The readable summary: per target status and main figures, then the checks."""
    print()
    print(f"scale bench  {report['date']}  commit {report['git']['commit']}{' (dirty)' if report['git']['dirty'] else ''}")
    m = report["machine"]
    print(f"machine: {m['nproc']} cpus, {m['cpu_model']}, {(m['mem_total_bytes'] or 0) / 2**30:.1f} GiB")
    mem = m.get("memory")
    if mem:
        print(f"memory: {mem['fault_us_per_page']} us per page faulted in, {mem['warm_read_us_per_page']} us per page "
              f"read warm, {mem['cold_read_us_per_page']} us per page read after {mem['idle_s']:g} s idle")
    print("settings: " + ", ".join(f"{k}={v}" for k, v in report["settings"].items()))
    print()
    hdr = f"{'target':<10} {'status':<8} {'init s':>8} {'p99 ms':>8} {'RSS0 MB':>8} {'RSS1 MB':>8} {'peak MB':>8} {'KB/prx':>8} {'CPU s':>7} {'build ms':>9}"
    print(hdr)
    print("-" * len(hdr))
    for name, r in report["targets"].items():
        f = r.get("figures") or {}
        ini = (f.get("phases") or {}).get("initial") or {}
        print(
            f"{name:<10} {r['status']:<8} {_fmt(ini.get('seconds')):>8} {_fmt(ini.get('p99_ms'), 1):>8} "
            f"{_fmt(f.get('rss_before_mb'), 1):>8} {_fmt(f.get('rss_after_initial_mb'), 1):>8} "
            f"{_fmt(f.get('rss_peak_mb'), 1):>8} {_fmt(f.get('rss_per_proxy_kb'), 1):>8} "
            f"{_fmt(ini.get('cpu_s')):>7} {_fmt(f.get('full_build_ms'), 2):>9}"
        )
        for ph, v in (f.get("phases") or {}).items():
            if ph == "initial":
                continue
            print(
                f"  {ph:<16} p99 {_fmt(v.get('p99_ms'), 1):>7} ms  pushed {_fmt(v.get('pushed'), 0):>6}  "
                f"bytes/proxy {_fmt(v.get('bytes_per_proxy'), 0):>7}  CPU {_fmt(v.get('cpu_s')):>6} s  "
                f"build {_fmt(v.get('build_ms'), 3)} ms ({v.get('builds', 0)})"
            )
        pl = r.get("pilot_load")
        if pl:
            if pl.get("status") in ("ok", "incomplete"):
                c, u = pl["connect"], pl["first_update"]
                print(
                    f"  pilot-load adsc  {pl['status']}: {c.get('n', 0)} connected (p50 {_fmt(c.get('p50_ms'), 1)} ms, "
                    f"p99 {_fmt(c.get('p99_ms'), 1)} ms), first update p50 {_fmt(u.get('p50_ms'), 1)} ms "
                    f"p99 {_fmt(u.get('p99_ms'), 1)} ms max {_fmt(u.get('max_ms'), 1)} ms, {pl.get('errors', 0)} errors"
                )
            else:
                print(f"  pilot-load adsc  {pl.get('status')}: {(pl.get('why') or '').splitlines()[0]}")
        if r["status"] != "ok":
            print(f"  error: {(r.get('error') or '').splitlines()[0] if r.get('error') else ''}")
    for target, c in report.get("checks", {}).items():
        print()
        note = f" (incomplete runs: {', '.join(c['incomplete'])})" if c["incomplete"] else ""
        print(f"{target}: figure, value, target, vs limit, vs istiod{note}")
        for row in c["rows"]:
            print(
                f"  {row['figure']:<34} {_fmt(row['value'], 3):>10}  {row.get('target', ''):<14} "
                f"{_verdict(row.get('pass')):<5} x{_fmt(row['vs_limit'])} limit  x{_fmt(row['vs_istiod'])} istiod "
                f"{ {True: 'ahead of istiod', False: 'NOT ahead of istiod', None: ''}[row['ahead_of_istiod']]}"
            )
            rounds = row.get("rounds") or {}
            if len(rounds.get("value") or []) > 1:
                each = "  ".join(f"{who} {', '.join(_fmt(v, 1) for v in vs)}" for who, vs in rounds.items() if vs)
                print(f"    each round: {each}")
    for name, r in report["targets"].items():
        if r["status"] != "ok" and r.get("error"):
            print()
            print(f"== {name} {r['status']}: {r['error']}")
    print()
