"""Optional second client: howardjohn/pilot-load's `adsc` mode (N plain ADS connections, as
istio's own load tests use) against meshpilot and istiod. It reports what pilot-load logs: each
connection's connect time and the time to its first update."""

import os
import re
import time

from procs import StepError

WHY_NOT_INSTALLED = (
    "`GOFLAGS=-mod=mod go install github.com/howardjohn/pilot-load@latest` (and @master) fails here: the Go "
    "module proxy answers 403 'This module version is not available' for github.com/howardjohn/pilot-load. "
    "It does build from a checkout of its repository (`go build -o ~/go/bin/pilot-load .`, dependencies from "
    "the module proxy); put the binary at $GOPATH/bin/pilot-load or set MESHPILOT_BENCH_PILOT_LOAD."
)


def binary():
    """pilot-load: $MESHPILOT_BENCH_PILOT_LOAD, else $GOPATH/bin/pilot-load (default ~/go/bin)."""
    explicit = os.environ.get("MESHPILOT_BENCH_PILOT_LOAD")
    if explicit:
        return explicit
    gopath = os.environ.get("GOPATH") or os.path.join(os.path.expanduser("~"), "go")
    return os.path.join(gopath, "bin", "pilot-load")


def status():
    """{'available', 'binary', 'why'}: whether the pilot-load target can run, and if not why."""
    b = binary()
    if os.path.isfile(b) and os.access(b, os.X_OK):
        return {"available": True, "binary": b}
    return {"available": False, "binary": b, "why": WHY_NOT_INSTALLED}


_UNITS = {"ns": 1e-6, "us": 1e-3, "µs": 1e-3, "μs": 1e-3, "ms": 1.0, "s": 1000.0, "m": 60000.0, "h": 3600000.0}


def go_duration_ms(text):
    """A Go duration ('1.5s', '2m3.1s', '350.2µs') in ms, or None."""
    parts = re.findall(r"([0-9.]+)(ns|us|µs|μs|ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _stats(values):
    """{n, p50, p99, max} of a list of ms."""
    if not values:
        return {"n": 0}
    v = sorted(values)
    at = lambda q: v[min(len(v) - 1, int(q * len(v)))]  # noqa: E731
    return {"n": len(v), "p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": v[-1]}


def parse(log_text):
    """Connect and first-update times from pilot-load's log lines."""
    connected = [go_duration_ms(m) for m in re.findall(r"Connected: \S+ in (\S+)", log_text)]
    first = [go_duration_ms(m) for m in re.findall(r"Got Initial Update: \S+ for \S+ in (\S+)", log_text)]
    return {
        "connect": _stats([c for c in connected if c is not None]),
        "first_update": _stats([f for f in first if f is not None]),
        "errors": len(re.findall(r"Error in ADS connection", log_text)),
    }


def run(opts, running, workdir, group):
    """Runs `pilot-load adsc` with opts.proxies connections against running's xDS address
    until each has had its first update (or opts.pilot_load_seconds pass); its figures."""
    st = status()
    if not st["available"]:
        return {"status": "skipped", "why": st["why"]}
    kubeconfig = running.notes.get("kubeconfig")
    if not kubeconfig:
        # pilot-load always builds a Kubernetes client from a kubeconfig; adsc mode does not use it.
        kubeconfig = os.path.join(workdir, "pilot-load.kubeconfig")
        with open(kubeconfig, "w") as f:
            f.write(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: none\n  cluster: {server: 'http://127.0.0.1:9'}\n"
                "users:\n- name: none\n  user: {}\ncontexts:\n- name: none\n  context: {cluster: none, user: none}\n"
                "current-context: none\n"
            )
    address = running.xds_url.split("://", 1)[-1]
    p = group.start(
        "pilot-load",
        [st["binary"], "adsc", "--pilot-address", address, "--count", opts.proxies, "--delay", "0s",
         "--namespace", "ns-0", f"--delta={'true' if opts.mode == 'delta' else 'false'}", "--auth", "plaintext",
         "--kubeconfig", kubeconfig],
    )
    t0 = time.monotonic()
    figures = {}
    while time.monotonic() - t0 < opts.pilot_load_seconds and p.alive():
        time.sleep(0.5)
        with open(p.log_path, errors="replace") as f:
            figures = parse(f.read())
        if figures["first_update"].get("n", 0) >= opts.proxies:
            break
    seconds = time.monotonic() - t0
    exited = not p.alive()
    p.stop()
    with open(p.log_path, errors="replace") as f:
        figures = parse(f.read())
    figures["seconds_until_all_updated_or_timeout"] = seconds
    figures["log"] = p.log_path
    if exited:
        raise StepError(f"pilot-load exited early:\n{p.tail(20)}")
    figures["status"] = "ok" if figures["first_update"].get("n", 0) >= opts.proxies else "incomplete"
    return figures
