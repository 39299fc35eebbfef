//! A real etcd server for tests: 127.0.0.1, ports from [`super::ports`], killed on drop; can be
//! killed and restarted on the same ports (same or fresh data dir).
//!
//! By default it runs as deployed: TLS on client and peer ports, and `--client-cert-auth` with a
//! CA of its own, so only clients holding [`EtcdEndpoint::tls`]'s certificate get in.
//! [`Etcd::start_plaintext`] is for the few tests that need an unauthenticated etcd.

use std::path::{Path, PathBuf};
use std::time::Duration;

use meshpilot::cluster::etcd::{connect_with_tls, EtcdTls};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

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

/// An etcd's client URL and what a client needs to get in: for a TLS etcd its CA and a client
/// certificate it accepts; for a plaintext one `insecure` (meshpilot's `--insecure-etcd`).
#[derive(Debug, Clone)]
pub struct EtcdEndpoint {
    /// `https://127.0.0.1:PORT` (or `http://` for a plaintext etcd).
    pub url: String,
    /// meshpilot's etcd TLS settings for it.
    pub tls: EtcdTls,
}

impl EtcdEndpoint {
    /// meshpilot's flags reaching this etcd (`--etcd-cacert/--etcd-cert/--etcd-key`, or
    /// `--insecure-etcd`), without `--etcd-endpoints`.
    pub fn meshpilot_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let files = [("--etcd-cacert", &self.tls.ca), ("--etcd-cert", &self.tls.cert), ("--etcd-key", &self.tls.key)];
        for (flag, file) in files {
            if let Some(file) = file {
                args.extend([flag.to_string(), file.display().to_string()]);
            }
        }
        if self.tls.insecure {
            args.push("--insecure-etcd".into());
        }
        args
    }

    /// etcdctl's flags for the same access (`--endpoints`, `--cacert/--cert/--key`).
    pub fn etcdctl_args(&self) -> Vec<String> {
        let mut args = vec![format!("--endpoints={}", self.url)];
        let files = [("--cacert", &self.tls.ca), ("--cert", &self.tls.cert), ("--key", &self.tls.key)];
        for (flag, file) in files {
            if let Some(file) = file {
                args.push(format!("{flag}={}", file.display()));
            }
        }
        args
    }

    /// A meshpilot etcd client for it (lazy: succeeds while etcd is down).
    pub async fn client(&self) -> etcd_client::Client {
        connect_with_tls(std::slice::from_ref(&self.url), &self.tls).await.expect("an etcd client")
    }
}

/// The files of an etcd's own CA: its serving (and peer) certificate and one client certificate.
struct EtcdCerts {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl EtcdCerts {
    /// A fresh CA in `dir`, a certificate for 127.0.0.1/localhost (server and peer), and a
    /// client certificate for meshpilot.
    fn write(dir: &Path) -> EtcdCerts {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "meshpilot test etcd CA");
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("a CA");
        let leaf = |name: &str, sans: Vec<SanType>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
            params.distinguished_name.push(DnType::CommonName, name);
            params.subject_alt_names = sans;
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            params.extended_key_usages = usages;
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &issuer).expect("signing a leaf");
            (cert.pem(), key.serialize_pem())
        };
        // etcd also dials itself (gateway, peers) with its serving certificate: client use too.
        let server = leaf(
            "etcd",
            vec![
                SanType::IpAddress([127, 0, 0, 1].into()),
                SanType::DnsName("localhost".try_into().expect("an IA5 name")),
            ],
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        );
        let client = leaf("meshpilot", Vec::new(), vec![ExtendedKeyUsagePurpose::ClientAuth]);
        std::fs::create_dir_all(dir).expect("creating the TLS dir");
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
            path
        };
        EtcdCerts {
            ca: file("ca.pem", &issuer.pem()),
            server_cert: file("server.pem", &server.0),
            server_key: file("server-key.pem", &server.1),
            client_cert: file("client.pem", &client.0),
            client_key: file("client-key.pem", &client.1),
        }
    }
}

/// A running (or killed) etcd; derefs to its [`Process`] (`kill`, `logs`, ...).
pub struct Etcd {
    process: Process,
    data: PathBuf,
    endpoint: EtcdEndpoint,
}

impl Etcd {
    /// Starts etcd with TLS and client-certificate authentication and waits until it serves.
    pub async fn start() -> Etcd {
        Etcd::start_with(true).await
    }

    /// Starts etcd in plaintext without authentication (meshpilot then needs `--insecure-etcd`,
    /// which [`EtcdEndpoint::meshpilot_args`] passes), for tests that need exactly that.
    pub async fn start_plaintext() -> Etcd {
        Etcd::start_with(false).await
    }

    async fn start_with(secure: bool) -> Etcd {
        init_logs();
        let dir = temp_dir("meshpilot-etcd-");
        let data = dir.path().join("data");
        let scheme = if secure { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", free_port());
        let peer = format!("{scheme}://127.0.0.1:{}", free_port());
        let mut spec = ProcessSpec::new("etcd", "etcd")
            .args(["--data-dir".into(), data.clone().into_os_string()])
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster".to_string(), format!("default={peer}")])
            .log_tail(60, 60);
        let tls = if secure {
            let certs = EtcdCerts::write(&dir.path().join("tls"));
            let path = |p: &PathBuf| p.display().to_string();
            for prefix in ["--", "--peer-"] {
                spec = spec.args([
                    format!("{prefix}cert-file"),
                    path(&certs.server_cert),
                    format!("{prefix}key-file"),
                    path(&certs.server_key),
                    format!("{prefix}trusted-ca-file"),
                    path(&certs.ca),
                    format!("{prefix}client-cert-auth"),
                ]);
            }
            EtcdTls { ca: Some(certs.ca), cert: Some(certs.client_cert), key: Some(certs.client_key), insecure: false }
        } else {
            EtcdTls { insecure: true, ..EtcdTls::default() }
        };
        let etcd = Etcd { process: Process::start(dir, spec), data, endpoint: EtcdEndpoint { url: client, tls } };
        etcd.wait_serving().await;
        etcd
    }

    /// Its client URL and the credentials it accepts; meshpilot's harness takes `&etcd.endpoint()`.
    pub fn endpoint(&self) -> EtcdEndpoint {
        self.endpoint.clone()
    }

    /// `https://127.0.0.1:PORT` (`http://` for a plaintext etcd).
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    /// A client with the accepted credentials (meshpilot's connect).
    pub async fn client(&self) -> etcd_client::Client {
        self.endpoint.client().await
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
                    let endpoints = std::slice::from_ref(&self.endpoint.url);
                    let mut client = connect_with_tls(endpoints, &self.endpoint.tls).await.ok()?;
                    client.status().await.ok()
                };
                matches!(tokio::time::timeout(Duration::from_secs(2), answered).await, Ok(Some(_)))
            })
            .await;
        assert!(serving, "etcd did not serve within {STARTUP_TIMEOUT:?}; log:\n{}", self.failure_log());
    }
}

deref_to_process!(Etcd);
