//! A real etcd server for tests: 127.0.0.1, ports chosen at run time, killed on drop; can be
//! killed and restarted on the same ports (same or fresh data dir).
#![allow(dead_code)]

pub use crate::common::ports::free_port;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Logs meshpilot's tracing to the test output when `RUST_LOG` is set (e.g. `RUST_LOG=meshpilot=debug`).
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A running (or stopped) etcd.
pub struct Etcd {
    dir: tempfile::TempDir,
    data: PathBuf,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
    starts: u32,
}

impl Etcd {
    /// Starts etcd and waits until it serves.
    pub async fn start() -> Etcd {
        init_logs();
        let dir = tempfile::Builder::new().prefix("meshpilot-etcd-").tempdir().expect("temp dir");
        let data = dir.path().join("data");
        let mut etcd = Etcd { dir, data, client_port: free_port(), peer_port: free_port(), child: None, starts: 0 };
        etcd.spawn();
        etcd.wait_serving().await;
        etcd
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Kills etcd (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports and data dir (it was killed) and waits until it serves.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn();
        self.wait_serving().await;
    }

    /// Starts etcd again on the same ports with an empty data dir: everything it held is gone.
    pub async fn restart_empty(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.data);
        self.spawn();
        self.wait_serving().await;
    }

    /// The tail of etcd's log.
    pub fn logs(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("etcd log");
        let client = format!("http://127.0.0.1:{}", self.client_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(&self.data)
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn etcd (install it with scripts/setup.sh): {e}"));
        self.child = Some(child);
    }

    /// Waits until etcd answers a request (ports may need a moment after a restart).
    async fn wait_serving(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("etcd exited with {status}; log:\n{}", self.logs());
                }
            }
            let answered = async {
                let mut client = etcd_client::Client::connect([self.endpoint()], None).await.ok()?;
                client.status().await.ok()
            };
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(2), answered).await {
                return;
            }
            assert!(Instant::now() < deadline, "etcd did not serve within 60 s; log:\n{}", self.logs());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- etcd log ---\n{}", self.logs());
        }
        self.kill();
    }
}

/// Polls `f` every 50 ms until it is true (→ true) or `timeout` passes (→ false).
pub async fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
