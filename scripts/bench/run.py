"""One benchmark run: every target in turn, as separate processes, on the same mesh and the same
load client; each target's failure is recorded (with the failing process's log tail) and the
others still run."""

import json
import os
import shutil
import subprocess
import time
import traceback

import mesh as meshgen
import pilotload
import servers
from measure import PhaseHook, Sampler, client_flags, read_report
from procs import ProcGroup, StepError, http
from report import checks, figures, git_state, machine, utc_now

TARGETS = ("meshpilot", "limit", "istiod", "split")


def phases_file(path, names, hook):
    """Writes the load client's phases file: each phase first posts to the hook's prepare URL
    (the bench samples there, before the phase's clock starts), then its action posts to the
    hook's phase URL (the edit)."""
    phases = [{"name": n, "prepare": hook.prepare_url(n), "action": {"post": hook.url(n)}} for n in names]
    with open(path, "w") as f:
        json.dump({"phases": phases}, f, indent=1)


def direct_phases_file(path, mesh, post_base):
    """The contract's plain form: `write` actions (or `post` to the replay server)."""
    phases = []
    for name, (file, content) in mesh.edits.items():
        action = {"post": f"{post_base}/phase/{name}"} if post_base else {"write": [{"path": file, "content": content}]}
        phases.append({"name": name, "action": action})
    with open(path, "w") as f:
        json.dump({"phases": phases}, f, indent=1)


def client_argv(opts, flags, xds_url, phases_path, json_out, capture):
    """`meshpilot load ...` with the flags this build of the client knows."""
    nss = ",".join(f"ns-{k}" for k in range(opts.namespaces))
    wanted = [
        ("--xds-url", xds_url), ("--proxies", opts.proxies), ("--workloads", opts.workloads),
        ("--namespaces", nss), ("--mode", opts.mode), ("--phases", phases_path),
        ("--settle", f"{int(opts.settle * 1000)}ms"), ("--connect-rate", opts.connect_rate or None), ("--timeout", f"{opts.client_timeout}s"), ("--json", json_out),
        ("--capture", capture),
    ]
    argv = [opts.meshpilot, "load"]
    for flag, value in wanted:
        if value is not None and flag in flags:
            argv += [flag, str(value)]
    return argv


def run_client(opts, flags, running, workdir, phase_names, hook, sampler, mesh, capture):
    """Runs the load client against running; phases through the hook (or, for a client without
    --phases, performed by the bench after it). Returns (report, client log path, exit code)."""
    phases_path = os.path.join(workdir, "phases.json")
    if opts.phase_actions == "hook":
        phases_file(phases_path, phase_names, hook)
    else:
        direct_phases_file(phases_path, mesh, running.phase_post)
    json_out = os.path.join(workdir, "load.json")
    argv = client_argv(opts, flags, running.xds_url, phases_path, json_out, capture)
    log = os.path.join(workdir, "load-client.log")
    sampler.take("before load")
    with open(log, "w") as out, open(log + ".stdout", "w") as stdout:
        out.write("$ " + " ".join(argv) + "\n")
        out.flush()
        try:
            rc = subprocess.run(argv, stdout=stdout, stderr=out, timeout=opts.client_timeout + 120).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if "--phases" not in flags:
        # An older client: initial convergence only; the bench runs the edits itself (CPU and
        # build times are still measured; the client's per-phase latencies are not).
        sampler.take("after initial")  # ends 'initial' before the first edit
        for name in phase_names:
            status, body = hook.run(name)
            if status != 200:
                raise StepError(f"phase {name}: {body.decode().strip()}")
            time.sleep(opts.settle + 1.0)
    sampler.take("end")
    with open(log + ".stdout") as f:
        stdout_text = f.read()
    with open(log, "a") as out:
        out.write(stdout_text)
    return read_report(json_out, stdout_text), log, rc


def tail(path, lines=30):
    """Last lines of a file."""
    try:
        with open(path) as f:
            return "\n".join(f.read().splitlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def start(target, opts, group, workdir, mesh_dir, capture):
    """Starts target's servers (a Running)."""
    if target == "meshpilot":
        return servers.start_meshpilot(group, opts.meshpilot, mesh_dir)
    if target == "limit":
        return servers.start_limit(group, opts.meshpilot, capture)
    if target == "istiod":
        return servers.start_istiod(group, opts.repo, workdir, mesh_dir, opts.services, opts.istiod_request_limit)
    if target == "split":
        return servers.start_split(group, opts.meshpilot, workdir, mesh_dir, opts.frontends)
    raise StepError(f"unknown target {target}")


def run_target(target, opts, flags, root, capture):
    """Runs one target end to end; its result dict (status ok, incomplete or failed)."""
    workdir = os.path.join(root, target)
    result = {"status": "failed", "logs": workdir}
    step = "generating the mesh"
    hook = None
    print(f"== {target}: starting (logs in {workdir})", flush=True)
    try:
        if os.path.isdir(workdir):
            shutil.rmtree(workdir)  # the previous run's mesh and logs
        os.makedirs(workdir)
        mesh = meshgen.generate(os.path.join(workdir, "mesh"), mesh_settings(opts), opts.repeat)
        result["mesh_objects"] = mesh.counts
        step = "starting"
        with ProcGroup(os.path.join(workdir, "logs")) as group:
            t0 = time.monotonic()
            running = start(target, opts, group, workdir, mesh.dir, capture)
            result["startup_seconds"] = time.monotonic() - t0
            result["notes"] = {k: v for k, v in running.notes.items() if k != "kubeconfig"}
            pids = {r: p.pid for r, p in {**running.servers, **running.support}.items()}
            sampler = Sampler(pids, running.metrics)
            actions = {}
            for name, (path, content) in mesh.edits.items():
                if running.phase_post:
                    def post(name=name):
                        status, body = http("POST", f"{running.phase_post}/phase/{name}", body=b"", timeout=60)
                        if status != 200:
                            raise StepError(f"replay POST /phase/{name}: {status} {body.strip()[:300]}")
                    actions[name] = post
                else:
                    actions[name] = lambda path=path, content=content: meshgen.write_atomically(path, content)
            hook = PhaseHook(sampler, actions)
            step = "load client"
            print(f"== {target}: up in {result['startup_seconds']:.1f} s; load client on {running.xds_url}", flush=True)
            client, log, rc = run_client(opts, flags, running, workdir, list(mesh.edits), hook, sampler, mesh,
                                         capture if target == "meshpilot" else None)
            result["client"] = client
            result["client_exit"] = rc
            result["client_log"] = log
            result["phase_errors"] = hook.errors
            if target == "istiod":
                result["notes"]["configs_at_end"] = servers.istiod_configs(running.notes["http"])
            if target in ("meshpilot", "istiod") and opts.pilot_load:
                try:
                    result["pilot_load"] = pilotload.run(opts, running, workdir, group)
                except StepError as e:
                    result["pilot_load"] = {"status": "failed", "why": str(e)}
                    print(f"== {target}: pilot-load failed: {e}", flush=True)
            step = "figures"
            result["figures"] = figures(sampler, running, client, opts.proxies)
            dead = [r for r, p in {**running.servers, **running.support}.items() if not p.alive()]
            if dead:
                raise StepError(f"{', '.join(dead)} exited during the run:\n" +
                                "\n".join(running.servers.get(r, running.support.get(r)).tail(20) for r in dead))
            if client is None or rc != 0 or hook.errors:
                why = (f"load client exit {rc}{', phase errors: ' + '; '.join(hook.errors) if hook.errors else ''}"
                       f"\n--- last lines of {log} ---\n{tail(log)}")
                if client is None or hook.errors:
                    raise StepError(why)
                # A report, but not every proxy converged (or a phase timed out): the figures
                # stand, marked.
                result["status"] = "incomplete"
                result["error"] = f"{target} / load client: {why}"
            else:
                result["status"] = "ok"
    except StepError as e:
        result["error"] = f"{target} / {step}: {e}"
    except KeyboardInterrupt:
        result["error"] = f"{target} / {step}: interrupted"
        raise
    except Exception:  # a bug in the bench itself: report it, and the other targets still run
        result["error"] = f"{target} / {step}: {traceback.format_exc()}"
    finally:
        if hook:
            hook.close()
    if result["status"] == "incomplete":
        print(f"== {target}: INCOMPLETE (figures kept): {result['error'].splitlines()[0]}", flush=True)
    elif result["status"] != "ok":
        print(f"== {target}: FAILED at {step}:\n{result['error']}", flush=True)
    else:
        print(f"== {target}: done", flush=True)
    return result


def run_all(opts):
    """Every requested target in order; the full report dict."""
    flags, why = client_flags(opts.meshpilot)
    root = opts.workdir
    os.makedirs(root, exist_ok=True)
    capture = os.path.join(root, "capture")
    report = {
        "date": utc_now(),
        "machine": machine(),
        "git": git_state(opts.repo),
        "settings": opts.settings(),
        "load_client_flags": sorted(flags),
        "targets": {},
    }
    if why:
        report["load_client_error"] = why
    missing = [f for f in ("--phases", "--json", "--capture", "--workloads", "--mode") if f not in flags]
    if missing:
        report["load_client_missing_flags"] = missing
        print(f"note: this meshpilot load lacks {', '.join(missing)}: the bench adapts", flush=True)
    for target in opts.targets:
        if target == "limit":
            skip = None
            if "--capture" not in flags:
                skip = "the load client has no --capture: nothing to replay"
            elif report["targets"].get("meshpilot", {}).get("status") != "ok":
                skip = "needs a successful meshpilot run first (its capture)"
            elif not has_subcommand(opts.meshpilot, "replay"):
                skip = "this meshpilot has no `replay` subcommand"
            if skip:
                report["targets"][target] = {"status": "skipped", "error": skip}
                print(f"== limit: skipped: {skip}", flush=True)
                continue
        if target == "istiod" and opts.istiod_max_proxies and opts.proxies > opts.istiod_max_proxies:
            skip = (f"--istiod-max-proxies {opts.istiod_max_proxies}: istiod holds about 1.6 MB per proxy here, "
                    f"so {opts.proxies} proxies would not fit this machine's memory beside the client")
            report["targets"][target] = {"status": "skipped", "error": skip}
            print(f"== istiod: skipped: {skip}", flush=True)
            continue
        if target == "split" and opts.frontends == 0:
            report["targets"][target] = {"status": "skipped", "error": "--frontends 0 (standalone only)"}
            continue
        if target == "meshpilot" and os.path.isdir(capture):
            shutil.rmtree(capture)
        report["targets"][target] = run_target(target, opts, flags, root, capture)
    if opts.pilot_load:
        report["pilot_load"] = pilotload.status()
    importers = {ph: meshgen.importing_proxies(mesh_settings(opts), ph, opts.proxies, opts.workloads)
                 for ph in meshgen.phase_names(opts.repeat)}
    report["importing_proxies"] = importers
    report["checks"] = checks(report["targets"], importers)
    return report


def mesh_settings(opts):
    """The mesh the options describe."""
    return meshgen.MeshSettings(opts.services, opts.endpoints, opts.namespaces, opts.vs_every, opts.dr_every,
                                opts.sidecar_scoping == "on")


def has_subcommand(meshpilot, name):
    """Whether `meshpilot --help` lists subcommand name."""
    r = subprocess.run([meshpilot, "--help"], capture_output=True, text=True)
    return any(line.split()[:1] == [name] for line in r.stdout.splitlines())
