//! The one handle for a process a test starts (meshpilot in any mode, Envoy, etcd, Prometheus).
//!
//! A [`Process`] owns a temp dir (for its files and its log), sends stdout and stderr to a log
//! file there, can be killed (`kill -9`), stopped gracefully (SIGTERM) and started again with the
//! same command line, and is killed on drop. If the test is panicking then, the tail of its log is
//! printed (shown by `cargo test` for failed tests). `MESHPILOT_KEEP_TEMP=1` keeps the temp dir.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::http::http_request;
use super::poll::{poll, Outcome};

/// How long a SIGTERM'd process gets to exit before [`Process::terminate`] kills it.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// How many log lines a [`Process`] prints when something fails.
#[derive(Debug, Clone, Copy)]
pub struct LogTail {
    /// When the process has exited or is not ready in time.
    pub failure: usize,
    /// When the test panics while the process is dropped.
    pub on_drop: usize,
}

/// How to run a [`Process`]: its command line, environment and how much log to show.
#[derive(Debug, Clone)]
pub struct ProcessSpec {
    /// What messages call it (`meshpilot`, `frontend fe-a`, `etcd`, ...).
    pub label: String,
    /// The binary.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Variables set (after `env_remove`).
    pub env: Vec<(OsString, OsString)>,
    /// Variables of the test's environment the process must not inherit.
    pub env_remove: Vec<OsString>,
    /// Its working directory (default: the test's).
    pub current_dir: Option<PathBuf>,
    /// How many log lines to print on failures.
    pub log_tail: LogTail,
}

impl ProcessSpec {
    /// `program` with no arguments, labelled `label`, printing 100 log lines on failures.
    pub fn new(label: impl Into<String>, program: impl Into<PathBuf>) -> ProcessSpec {
        ProcessSpec {
            label: label.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_remove: Vec::new(),
            current_dir: None,
            log_tail: LogTail { failure: 100, on_drop: 100 },
        }
    }

    /// Adds arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Keeps a variable of the test's environment from the process.
    pub fn env_remove(mut self, key: impl Into<OsString>) -> Self {
        self.env_remove.push(key.into());
        self
    }

    /// Runs the process in `dir`.
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Log lines printed when the process fails, and when a failing test drops it.
    pub fn log_tail(mut self, failure: usize, on_drop: usize) -> Self {
        self.log_tail = LogTail { failure, on_drop };
        self
    }
}

/// A fresh temp dir named `PREFIX...`, for a process's files.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(prefix).tempdir().unwrap_or_else(|e| panic!("temp dir {prefix}: {e}"))
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn keep_temp() -> bool {
    std::env::var_os("MESHPILOT_KEEP_TEMP").is_some_and(|v| !v.is_empty() && v != "0")
}

/// One running (or killed) process; see the module docs.
pub struct Process {
    spec: ProcessSpec,
    dir: Option<tempfile::TempDir>,
    log_path: PathBuf,
    child: Option<Mutex<Child>>,
    starts: u32,
}

impl Process {
    /// Spawns `spec` with its log in `dir` (which the process owns from now on; files the command
    /// line names may already be there) and returns at once.
    pub fn start(dir: tempfile::TempDir, spec: ProcessSpec) -> Process {
        let log_path = dir.path().join("output.log");
        let mut p = Process { spec, dir: Some(dir), log_path, child: None, starts: 0 };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is running", self.spec.label);
        self.starts += 1;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("{}: open {}: {e}", self.spec.label, self.log_path.display()));
        if self.starts > 1 {
            // Marks where each run's output starts (readers of the log split runs on it).
            let _ = writeln!(log, "---- start #{} ----", self.starts);
        }
        let mut cmd = Command::new(&self.spec.program);
        cmd.args(&self.spec.args);
        for key in &self.spec.env_remove {
            cmd.env_remove(key);
        }
        for (key, value) in &self.spec.env {
            cmd.env(key, value);
        }
        if let Some(dir) = &self.spec.current_dir {
            cmd.current_dir(dir);
        }
        let out = log.try_clone().unwrap_or_else(|e| panic!("{}: log file: {e}", self.spec.label));
        cmd.stdin(Stdio::null()).stdout(out).stderr(log);
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "{}: spawn {}: {e} (`bash scripts/setup.sh` installs what the tests run)",
                self.spec.label,
                self.spec.program.display()
            )
        });
        self.child = Some(Mutex::new(child));
    }

    /// What messages call the process.
    pub fn label(&self) -> &str {
        &self.spec.label
    }

    /// The process's temp dir (its log and whatever was put there before the start).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("the temp dir is kept until drop").path()
    }

    /// The process id while started (None once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| lock(c).id())
    }

    /// How it ended, if it was started and has exited by itself (None while running or killed).
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.child.as_ref().and_then(|c| lock(c).try_wait().ok().flatten())
    }

    /// Whether the process was started and has not exited.
    pub fn is_running(&self) -> bool {
        self.child.is_some() && self.exit_status().is_none()
    }

    /// How many times the process was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// `kill -9` now and wait for the exit (also done on drop). No-op if not running.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.take() {
            let mut child = c.into_inner().unwrap_or_else(|e| e.into_inner());
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits up to `grace` for the exit. Returns whether it exited in time; if not,
    /// it is killed (`-9`). No-op (true) if not running.
    pub async fn terminate(&mut self, grace: Duration) -> bool {
        let Some(pid) = self.pid() else { return true };
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let deadline = Instant::now() + grace;
        let exited = loop {
            if self.exit_status().is_some() {
                break true;
            }
            if Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        self.kill();
        exited
    }

    /// Kills the process if it runs and starts it again with the same command line (so on the
    /// same ports and files).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// stdout + stderr of every run (a restart starts with a `---- start #N ----` line).
    pub fn logs(&self) -> String {
        std::fs::read(&self.log_path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
    }

    /// The last `n` log lines.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.logs(), n)
    }

    /// The log tail shown when the process fails.
    pub fn failure_log(&self) -> String {
        self.log_tail(self.spec.log_tail.failure)
    }

    /// Panics with the log's tail unless the process runs.
    pub fn assert_running(&self) {
        let status = match (&self.child, self.exit_status()) {
            (None, _) => "been killed".to_string(),
            (Some(_), None) => return,
            (Some(_), Some(status)) => format!("exited with {status}"),
        };
        panic!("{} has {status}; log:\n{}", self.spec.label, self.failure_log());
    }

    /// Panics with `what` and the log's tail; first with how it ended if it is not running.
    pub fn fail(&self, what: &str) -> ! {
        self.assert_running();
        panic!("{}: {what}; log:\n{}", self.spec.label, self.failure_log())
    }

    /// Polls GET `url` (the process's readiness endpoint) until it answers 200; panics with the
    /// last answer and the log after `timeout`, or as soon as the process is not running.
    pub async fn wait_http_ready(&self, client: &reqwest::Client, url: &str, timeout: Duration) {
        let mut last = String::new();
        let ready = self
            .poll_while_running(timeout, async || {
                last = match http_request(client, "GET", url, "", &[], None).await {
                    Ok(r) if r.status == 200 => return true,
                    Ok(r) => format!("{} {}", r.status, r.body.trim()),
                    Err(e) => e.to_string(),
                };
                false
            })
            .await;
        if !ready {
            panic!(
                "{} not ready after {timeout:?} (last {url}: {last}); log:\n{}",
                self.spec.label,
                self.failure_log()
            );
        }
    }

    /// [`poll`]s `check`, panicking (with the log) as soon as the process is not running.
    pub async fn poll_while_running<T: Outcome>(&self, timeout: Duration, mut check: impl AsyncFnMut() -> T) -> T {
        poll(timeout, async || {
            self.assert_running();
            check().await
        })
        .await
    }
}

fn lock(child: &Mutex<Child>) -> std::sync::MutexGuard<'_, Child> {
    child.lock().unwrap_or_else(|e| e.into_inner())
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Process({}, pid {:?})", self.spec.label, self.pid())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- {} log tail ----\n{}\n----", self.spec.label, self.log_tail(self.spec.log_tail.on_drop));
        }
        if keep_temp() {
            if let Some(dir) = self.dir.take() {
                eprintln!("keeping {} dir {}", self.spec.label, dir.keep().display());
            }
        }
    }
}

/// Implements `Deref` and `DerefMut` to the [`Process`] in field `process` of a handle (meshpilot,
/// Envoy, etcd, Prometheus: processes with an API of their own on top).
macro_rules! deref_to_process {
    ($handle:ty) => {
        impl std::ops::Deref for $handle {
            type Target = $crate::common::process::Process;
            fn deref(&self) -> &Self::Target {
                &self.process
            }
        }

        impl std::ops::DerefMut for $handle {
            fn deref_mut(&mut self) -> &mut Self::Target {
                &mut self.process
            }
        }
    };
}
pub(crate) use deref_to_process;
