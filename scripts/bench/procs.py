"""Processes, ports and HTTP for the scale benchmark: every server a target runs is a Proc,
started in its own process group with its output in a log file, and stopped by a ProcGroup
(a context manager) whatever happens, Ctrl-C included."""

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request


class StepError(Exception):
    """A step of a target failed; the message says which and carries a log tail."""


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method, url, body=None, timeout=5.0, headers=None, context=None):
    """One HTTP request: (status, body text), or (None, error text) when nothing answered.
    context: an ssl.SSLContext for https."""
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        return None, str(e)


def get(url, timeout=5.0):
    """GET url: (status, body) as http() returns."""
    return http("GET", url, timeout=timeout)


class Proc:
    """One server process: output to LOGDIR/NAME.log, own process group, killed by stop()."""

    def __init__(self, name, argv, logdir, env=None, cwd=None):
        """Starts argv now; env adds to (not replaces) this process's environment."""
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log_path = os.path.join(logdir, f"{name}.log")
        full_env = dict(os.environ)
        full_env.update({k: str(v) for k, v in (env or {}).items()})
        self._log = open(self.log_path, "wb")
        self._log.write(("$ " + " ".join(self.argv) + "\n").encode())
        self._log.flush()
        try:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as e:
            self._log.close()
            raise StepError(f"{name}: cannot start {self.argv[0]}: {e}") from e

    @property
    def pid(self):
        """The process id."""
        return self.popen.pid

    def alive(self):
        """Whether it is still running."""
        return self.popen.poll() is None

    def tail(self, lines=30):
        """The last lines of its log."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 64 * 1024))
                text = f.read().decode("utf-8", "replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def fail(self, what):
        """A StepError naming this process, what went wrong, and its log tail."""
        state = "running" if self.alive() else f"exited with {self.popen.returncode}"
        return StepError(f"{self.name} ({state}): {what}\n--- last lines of {self.log_path} ---\n{self.tail()}")

    def stop(self, grace=10.0):
        """SIGTERM to its process group, SIGKILL after grace seconds."""
        if self.alive():
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.popen.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.popen.wait()
        self._log.close()


class ProcGroup:
    """The processes of one target; `with ProcGroup(dir) as g:` stops them all (newest first)
    on exit, also on errors and Ctrl-C."""

    def __init__(self, logdir):
        """Logs go to logdir (created)."""
        self.logdir = logdir
        os.makedirs(logdir, exist_ok=True)
        self.procs = []

    def start(self, name, argv, env=None, cwd=None):
        """Starts and remembers a Proc."""
        p = Proc(name, argv, self.logdir, env=env, cwd=cwd)
        self.procs.append(p)
        return p

    def stop_all(self):
        """Stops every process, newest first."""
        for p in reversed(self.procs):
            p.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop_all()
        return False


def wait_for(proc, what, check, timeout, interval=0.1, also=()):
    """Polls check() until it returns something truthy (returned); StepError with proc's log
    if proc (or any of `also`) exits or timeout seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        for p in (proc, *also):
            if not p.alive():
                raise p.fail(f"exited while waiting for {what}")
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise proc.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def wait_http_200(proc, url, timeout, also=()):
    """Waits until GET url answers 200."""
    return wait_for(proc, f"GET {url} = 200", lambda: get(url, timeout=2)[0] == 200, timeout, also=also)
