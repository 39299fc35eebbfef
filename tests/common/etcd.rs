//! A real etcd server for tests: 127.0.0.1, ports from [`super::ports`], killed on drop; can be
//! killed and restarted on the same ports (same or fresh data dir).

use std::path::PathBuf;
use std::time::Duration;

use super::poll::STARTUP_TIMEOUT;
use super::ports::free_port;
use super::process::{deref_to_process, temp_dir, Process, ProcessSpec};

/// Poll interval of tests timing etcd failover and step-down against a lease TTL of seconds.
pub const ETCD_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Logs meshpilot's tracing to the test output when `RUST_LOG` is set (e.g.
/// `RUST_LOG=meshpilot=debug`): the etcd tests run meshpilot's election and membership in-process.
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A running (or killed) etcd; derefs to its [`Process`] (`kill`, `logs`, ...).
pub struct Etcd {
    process: Process,
    data: PathBuf,
    client_port: u16,
}

impl Etcd {
    /// Starts etcd and waits until it serves.
    pub async fn start() -> Etcd {
        init_logs();
        let dir = temp_dir("meshpilot-etcd-");
        let data = dir.path().join("data");
        let client_port = free_port();
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{}", free_port());
        let spec = ProcessSpec::new("etcd", "etcd")
            .args(["--data-dir".into(), data.clone().into_os_string()])
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster".to_string(), format!("default={peer}")])
            .log_tail(60, 60);
        let etcd = Etcd { process: Process::start(dir, spec), data, client_port };
        etcd.wait_serving().await;
        etcd
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Starts etcd again on the same ports and data dir (after a kill) and waits until it serves.
    pub async fn restart(&mut self) {
        self.process.restart();
        self.wait_serving().await;
    }

    /// Starts etcd again on the same ports with an empty data dir: everything it held is gone.
    pub async fn restart_empty(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.data);
        self.restart().await;
    }

    /// Waits until etcd answers a request (ports may need a moment after a restart).
    async fn wait_serving(&self) {
        let serving = self
            .process
            .poll_while_running(STARTUP_TIMEOUT, async || {
                let answered = async {
                    let mut client = etcd_client::Client::connect([self.endpoint()], None).await.ok()?;
                    client.status().await.ok()
                };
                matches!(tokio::time::timeout(Duration::from_secs(2), answered).await, Ok(Some(_)))
            })
            .await;
        assert!(serving, "etcd did not serve within {STARTUP_TIMEOUT:?}; log:\n{}", self.failure_log());
    }
}

deref_to_process!(Etcd);
