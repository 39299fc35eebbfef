//! One meshpilot process for tests, whatever its mode: the standalone [`super::Meshpilot`] and
//! the cluster's [`super::cluster::IngestNode`] and [`super::cluster::FrontendNode`] all run one.
//!
//! The process listens on 127.0.0.1 ports chosen by its owner, writes its log to a file in its
//! own temp dir, can be killed (`kill -9`), stopped gracefully (SIGTERM) and started again on the
//! same ports, and is killed on drop; if the test is panicking then, the tail of its log is
//! printed. `MESHPILOT_KEEP_TEMP=1` keeps the temp dir.

use super::*;

/// How many log lines a [`MeshpilotProcess`] prints when something fails.
#[derive(Debug, Clone, Copy)]
pub struct LogTailLines {
    /// When the process has exited or is not ready in time.
    pub failure: usize,
    /// When the test panics while the process is dropped.
    pub on_drop: usize,
}

/// How to run a [`MeshpilotProcess`]; see [`MeshpilotProcess::start`].
pub struct ProcessSpec {
    /// `meshpilot`, `ingest ingest-0`, `frontend fe-a`: for messages.
    pub label: String,
    /// Prefix of the temp dir holding the log.
    pub dir_prefix: &'static str,
    /// Every argument of the binary (mode first).
    pub args: Vec<OsString>,
    /// Environment variables (after `RUST_LOG=info` and `NO_COLOR=1`).
    pub env: Vec<(String, String)>,
    /// The admin server's address (also among `args`).
    pub admin_addr: SocketAddr,
    /// Timeout of one admin request.
    pub request_timeout: Duration,
    pub log_tail: LogTailLines,
}

/// One running (or killed) `meshpilot MODE ...` process.
pub struct MeshpilotProcess {
    label: String,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    admin_addr: SocketAddr,
    log_tail_lines: LogTailLines,
    log_path: PathBuf,
    dir: Option<tempfile::TempDir>,
    child: Option<Mutex<Child>>,
    starts: u32,
    client: reqwest::Client,
}

impl MeshpilotProcess {
    /// Spawns the process and returns at once (see [`MeshpilotProcess::wait_ready`]).
    pub fn start(spec: ProcessSpec) -> MeshpilotProcess {
        let dir = tempfile::Builder::new().prefix(spec.dir_prefix).tempdir().unwrap();
        let client = reqwest::Client::builder().no_proxy().timeout(spec.request_timeout).build().unwrap();
        let mut p = MeshpilotProcess {
            label: spec.label,
            args: spec.args,
            env: spec.env,
            admin_addr: spec.admin_addr,
            log_tail_lines: spec.log_tail,
            log_path: dir.path().join("meshpilot.log"),
            dir: Some(dir),
            child: None,
            starts: 0,
            client,
        };
        p.spawn();
        p
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is running", self.label);
        self.starts += 1;
        let mut log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log_path).unwrap();
        if self.starts > 1 {
            use std::io::Write as _;
            let _ = writeln!(log, "---- start #{} ----", self.starts);
        }
        let mut cmd = Command::new(Meshpilot::binary());
        cmd.args(&self.args).env("RUST_LOG", "info").env("NO_COLOR", "1");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR")).stdin(Stdio::null()).stdout(log.try_clone().unwrap()).stderr(log);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {}: {e}", Meshpilot::binary().display()));
        self.child = Some(Mutex::new(child));
    }

    /// `meshpilot`, `ingest ingest-0`, `frontend fe-a`.
    pub fn label(&self) -> &str {
        &self.label
    }
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }
    /// `http://127.0.0.1:PORT` of the admin/metrics server.
    pub fn admin_url(&self) -> String {
        format!("http://{}", self.admin_addr)
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.lock().unwrap().id())
    }
    pub fn is_running(&self) -> bool {
        self.child.as_ref().is_some_and(|c| is_exited(c).is_none())
    }
    /// How many times the process was started.
    pub fn starts(&self) -> u32 {
        self.starts
    }

    /// `kill -9` now and wait for the exit (also done on drop). No-op if not running.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.take() {
            kill_and_wait(&c);
        }
    }

    /// SIGTERM, then waits up to `grace` for the exit. Returns whether it exited in time; if not,
    /// it is killed (`-9`). No-op (true) if not running.
    pub async fn terminate(&mut self, grace: Duration) -> bool {
        let Some(c) = self.child.take() else { return true };
        let pid = c.lock().unwrap().id();
        let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        let deadline = Instant::now() + grace;
        loop {
            if is_exited(&c).is_some() {
                return true;
            }
            if Instant::now() >= deadline {
                kill_and_wait(&c);
                return false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts the process again with the same arguments and addresses (after a kill).
    pub fn start_again(&mut self) {
        self.kill();
        self.spawn();
    }

    /// `kill -9`, then start again on the same addresses.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// stdout + stderr of every run (a restart starts with a `---- start #N ----` line).
    pub fn logs(&self) -> String {
        read_lossy(&self.log_path)
    }

    /// The last `n` log lines.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&self.logs(), n)
    }

    fn assert_running(&self) {
        let status = match &self.child {
            None => "been killed".to_string(),
            Some(c) => match is_exited(c) {
                None => return,
                Some(s) => format!("exited with {s}"),
            },
        };
        panic!("{} has {status}; log:\n{}", self.label, self.log_tail(self.log_tail_lines.failure));
    }

    pub async fn try_admin_get(&self, path: &str) -> Result<(u16, String), reqwest::Error> {
        let resp = self.client.get(format!("{}{}", self.admin_url(), path)).send().await?;
        let status = resp.status().as_u16();
        Ok((status, resp.text().await?))
    }

    /// GET an admin path; panics (with the log) if the process cannot be reached.
    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        match self.try_admin_get(path).await {
            Ok(r) => r,
            Err(e) => {
                self.assert_running();
                panic!("{} admin GET {path}: {e:?}; log:\n{}", self.label, self.log_tail(100))
            }
        }
    }

    /// GET an admin path answering JSON; None unless reachable, 200 and JSON.
    pub async fn try_admin_json(&self, path: &str) -> Option<Value> {
        match self.try_admin_get(path).await {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    /// GET an admin path answering JSON; panics unless 200.
    pub async fn admin_json(&self, path: &str) -> Value {
        let (status, body) = self.admin_get(path).await;
        assert_eq!(status, 200, "{} {path}: {body}", self.label);
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{} {path} is not JSON: {e}: {body}", self.label))
    }

    /// `/debug/node`; panics if unreachable.
    pub async fn node(&self) -> Value {
        self.admin_json("/debug/node").await
    }

    /// `/debug/node`, None if unreachable.
    pub async fn try_node(&self) -> Option<Value> {
        self.try_admin_json("/debug/node").await
    }

    /// `/metrics` text, None if unreachable.
    pub async fn try_metrics(&self) -> Option<String> {
        match self.try_admin_get("/metrics").await {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    }

    /// One unlabelled sample of `/metrics` (`name value`), None if absent or unreachable.
    pub async fn metric(&self, name: &str) -> Option<f64> {
        cluster::metric_value(&self.try_metrics().await?, name)
    }

    /// Polls `/ready` until 200; panics (with the log) on timeout or exit.
    pub async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running();
            let last = match self.try_admin_get("/ready").await {
                Ok((200, _)) => return,
                Ok((s, body)) => format!("{s} {}", body.trim()),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                panic!(
                    "{} not ready after {timeout:?} (last /ready: {last}); log:\n{}",
                    self.label,
                    self.log_tail(self.log_tail_lines.failure)
                );
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// Polls `f` until true (→ true) or timeout (→ false); panics if the process exits.
    pub async fn wait_for<F>(&self, timeout: Duration, mut f: F) -> bool
    where
        F: AsyncFnMut(&MeshpilotProcess) -> bool,
    {
        self.poll(timeout, async || f(self).await).await
    }

    /// [`MeshpilotProcess::wait_for`] with a condition that needs no argument (for owners that
    /// pass themselves).
    pub(super) async fn poll<F>(&self, timeout: Duration, mut f: F) -> bool
    where
        F: AsyncFnMut() -> bool,
    {
        let deadline = Instant::now() + timeout;
        loop {
            self.assert_running();
            if f().await {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl fmt::Debug for MeshpilotProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(admin {})", self.label, self.admin_addr)
    }
}

impl Drop for MeshpilotProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- {} (admin {}) log tail ----\n{}\n----",
                self.label,
                self.admin_addr,
                self.log_tail(self.log_tail_lines.on_drop)
            );
        }
        if keep_temp() {
            if let Some(dir) = self.dir.take() {
                eprintln!("keeping {} dir {}", self.label, dir.keep().display());
            }
        }
    }
}
