//! etcd plumbing shared by leader election and membership: connecting, bounded requests,
//! kept-alive leases.

mod lease;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

pub use lease::{revoke_lease, KeptLease, LeaseLost};

/// A failed etcd request.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// etcd answered with an error, or the connection failed.
    #[error("etcd: {0}")]
    Client(#[from] etcd_client::Error),
    /// No answer in time (etcd unreachable: the client's channel waits for a connection instead of failing).
    #[error("etcd did not answer within {0:?}")]
    Timeout(Duration),
    /// etcd answered, but not with what the protocol promises.
    #[error("etcd: {0}")]
    Protocol(String),
    /// The TLS files could not be read, or only some of them were given.
    #[error("etcd TLS: {0}")]
    Tls(String),
}

/// TLS towards etcd (`https://` endpoints): the CA that signed etcd's serving certificate, and
/// this client's certificate and key when etcd asks for one (`--client-cert-auth`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM CA bundle etcd's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// PEM client certificate (chain).
    pub cert: Option<PathBuf>,
    /// PEM client key.
    pub key: Option<PathBuf>,
}

impl EtcdTls {
    /// Whether any TLS setting was given.
    pub fn is_enabled(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// tonic's TLS options from the files; a certificate without its key (or the reverse) is an error.
    fn options(&self) -> Result<TlsOptions, EtcdError> {
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| EtcdError::Tls(format!("reading {}: {e}", p.display())));
        let mut options = TlsOptions::new();
        if let Some(ca) = &self.ca {
            options = options.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => options = options.identity(Identity::from_pem(read(cert)?, read(key)?)),
            (None, None) => {}
            _ => return Err(EtcdError::Tls("a client certificate needs its key, and a key its certificate".into())),
        }
        Ok(options)
    }
}

impl EtcdError {
    /// True if etcd answered that the thing asked about does not exist (e.g. a lease already gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, EtcdError::Client(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound)
    }
}

/// Connects to etcd (`http://host:port` endpoints). Connecting is lazy: this succeeds while
/// etcd is down, and the client reconnects by itself when it comes back.
pub async fn connect(endpoints: &[String]) -> Result<Client, EtcdError> {
    connect_with_tls(endpoints, &EtcdTls::default()).await
}

/// As [`connect`], with TLS towards etcd when `tls` gives any setting (then every endpoint must
/// be `https://`: a plaintext endpoint would silently skip it).
pub async fn connect_with_tls(endpoints: &[String], tls: &EtcdTls) -> Result<Client, EtcdError> {
    if tls.is_enabled() {
        if let Some(plain) = endpoints.iter().find(|e| !e.starts_with("https://")) {
            return Err(EtcdError::Tls(format!("endpoint {plain} is not https:// but etcd TLS files were given")));
        }
    }
    // HTTP/2 pings detect a silently dead connection under open streams (watches). etcd
    // refuses pings more often than every 5 s (--grpc-keepalive-min-time) and pings without
    // streams, hence these values.
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(false);
    let options = if tls.is_enabled() { options.with_tls(tls.options()?) } else { options };
    Ok(Client::connect(endpoints, Some(options)).await?)
}

/// Awaits an etcd request for at most `limit`.
pub async fn within<T>(
    limit: Duration,
    request: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, request).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(EtcdError::Timeout(limit)),
    }
}
