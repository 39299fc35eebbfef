"""Measurement: CPU and memory of server processes from /proc, Prometheus metrics scraped over
HTTP, and the phase hook: a small HTTP server the load client's phase actions post to, which
samples every server at each phase boundary before it performs the phase's edit."""

import json
import os
import re
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from procs import free_port, get

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime + stime of pid in seconds (its threads included), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after the closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def memory_bytes(pid):
    """{'rss': VmRSS, 'hwm': VmHWM} of pid in bytes, or None when it is gone."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out["rss" if key == "VmRSS" else "hwm"] = int(value.split()[0]) * 1024
    except OSError:
        return None
    return out


def sample_procs(procs):
    """{name: {'cpu': s, 'rss': B, 'hwm': B}} for {name: pid}; a gone process maps to None."""
    out = {}
    for name, pid in procs.items():
        cpu, mem = cpu_seconds(pid), memory_bytes(pid)
        out[name] = None if cpu is None or mem is None else {"cpu": cpu, **mem}
    return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text):
    """Prometheus text -> {metric name: sum over its label sets}."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out[m.group(1)] = out.get(m.group(1), 0.0) + value
    return out


def scrape(url):
    """Metrics at url parsed as parse_metrics does; {} when it does not answer 200."""
    status, body = get(url, timeout=10)
    return parse_metrics(body) if status == 200 else {}


#: Metric names worth keeping from a scrape (build times, pushes, xDS sends).
INTERESTING = re.compile(r"snapshot_build_seconds|push|xds_.*(sent|responses|bytes)|proxy_convergence|pushcontext")


def interesting(metrics):
    """The subset of parsed metrics the report keeps."""
    return {k: v for k, v in metrics.items() if INTERESTING.search(k) and not k.endswith("_bucket")}


def delta(after, before):
    """after - before for every metric in after (missing before counts as 0)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items()}


def build_ms(after, before, name="meshpilot_snapshot_build_seconds"):
    """Mean build time in ms of the builds between two scrapes, and their count."""
    n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
    s = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
    return (s / n * 1000.0 if n > 0 else None), int(n)


class Sampler:
    """Samples a target's processes (and its metrics endpoints) at named instants."""

    def __init__(self, procs, metrics_urls):
        """procs: {role: pid}; metrics_urls: {role: url} scraped at each sample."""
        self.procs = procs
        self.metrics_urls = metrics_urls
        self.samples = []

    def take(self, label):
        """Records a sample now, labelled label: every process, and every metrics URL scraped."""
        sample = {"label": label, "t": time.monotonic(), "procs": sample_procs(self.procs), "metrics": {}}
        sample["metrics"] = {role: scrape(url) for role, url in self.metrics_urls.items()}
        self.samples.append(sample)
        return sample

    def get(self, label):
        """The sample with that label, or None."""
        return next((s for s in self.samples if s["label"] == label), None)


class PhaseHook:
    """HTTP server the load client posts to around each phase: `POST /prepare/NAME` samples the
    processes and scrapes the metrics ('before NAME') before the phase's clock starts; `POST
    /phase/NAME`, the phase's action, performs the edit (a callable per phase name) and answers
    200 once done (500 on failure). Neither the sampling nor the scrapes are in the measured
    time, and every scrape is before its edit (meshpilot builds at once after a change)."""

    def __init__(self, sampler, actions):
        """actions: {phase name: callable()} that performs the phase's edit."""
        self.sampler = sampler
        self.actions = actions
        self.errors = []
        self.done = []
        self.prepared = set()
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (the http.server API)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                # The client may send the absolute form (`http://host:port/prepare/NAME`).
                kind, _, name = urllib.parse.urlsplit(self.path).path.strip("/").partition("/")
                status, body = hook.prepare(name) if kind == "prepare" else hook.run(name)
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.wfile.flush()

            def log_message(self, *args):
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name):
        """The URL a phase's action posts to."""
        return f"http://127.0.0.1:{self.port}/phase/{name}"

    def prepare_url(self, name):
        """The URL a phase posts to before its clock starts."""
        return f"http://127.0.0.1:{self.port}/prepare/{name}"

    def prepare(self, name):
        """Samples ('before NAME'), metrics included; (status, body bytes)."""
        if name not in self.actions:
            self.errors.append(f"unknown phase {name}")
            return 404, b"unknown phase\n"
        self.sampler.take(f"before {name}")
        self.prepared.add(name)
        return 200, b"ok\n"

    def run(self, name):
        """Performs the phase (sampling first if no prepare came); (status, body bytes)."""
        action = self.actions.get(name)
        if action is None:
            self.errors.append(f"unknown phase {name}")
            return 404, b"unknown phase\n"
        if name not in self.prepared:
            self.sampler.take(f"before {name}")
        try:
            action()
        except Exception as e:  # reported, and the client sees the 500
            self.errors.append(f"phase {name}: {e}")
            return 500, f"{e}\n".encode()
        self.done.append(name)
        return 200, b"ok\n"

    def close(self):
        """Stops the server."""
        self.server.shutdown()
        self.server.server_close()


def client_flags(meshpilot):
    """The long flags `meshpilot load --help` lists (the client is changing; the bench passes
    only what it knows)."""
    try:
        out = subprocess.run([meshpilot, "load", "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return set(), f"meshpilot load --help: {e}"
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", out.stdout + out.stderr)), None


def read_report(json_path, stdout_text):
    """The load client's report: the --json file, else the last JSON object line it printed."""
    if json_path and os.path.exists(json_path):
        with open(json_path) as f:
            return json.load(f)
    for line in reversed(stdout_text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return None


def pick(d, *names):
    """The first of names present in dict d as a float, in seconds where it is a time: a name
    ending in '_ms' is converted."""
    if not isinstance(d, dict):
        return None
    for n in names:
        v = d.get(n)
        if isinstance(v, (int, float)):
            return v / 1000.0 if n.endswith("_ms") else float(v)
    return None
