//! etcd plumbing shared by leader election and membership: connecting (authenticated unless
//! explicitly not), bounded requests, kept-alive leases, and etcd's text made safe to log.

mod lease;
mod logged;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

pub use lease::{revoke_lease, KeptLease, LeaseLost};
pub use logged::{logged, logged_bytes};

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
    /// The settings would reach etcd without authenticating both ends, and insecure access was
    /// not asked for: whoever can write etcd chooses the leader frontends follow.
    #[error("etcd access is not authenticated: {0}")]
    Unauthenticated(String),
}

/// TLS towards etcd (`https://` endpoints): the CA that signed etcd's serving certificate, and
/// this client's certificate and key, which etcd's `--client-cert-auth` requires. Without
/// `insecure`, [`connect_with_tls`] refuses plaintext endpoints and TLS without a client
/// certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM CA bundle etcd's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// PEM client certificate (chain).
    pub cert: Option<PathBuf>,
    /// PEM client key.
    pub key: Option<PathBuf>,
    /// Accept plaintext or certificate-less access (`--insecure-etcd`): warned about at connect.
    pub insecure: bool,
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

    /// Fails unless every endpoint is `https://` and a client certificate is given, or
    /// `insecure` says to accept less; the message names the flags to pass.
    pub fn check_authenticated(&self, endpoints: &[String]) -> Result<(), EtcdError> {
        if self.insecure {
            return Ok(());
        }
        if let Some(plain) = endpoints.iter().find(|e| !is_https(e)) {
            return Err(EtcdError::Unauthenticated(format!(
                "endpoint {} is plaintext; use https:// endpoints with --etcd-cacert, --etcd-cert and \
                 --etcd-key (etcd run with --client-cert-auth), or pass --insecure-etcd to accept an \
                 etcd anyone on the network can write",
                logged(plain)
            )));
        }
        if self.cert.is_none() || self.key.is_none() {
            return Err(EtcdError::Unauthenticated(
                "no client certificate for etcd; pass --etcd-cert and --etcd-key (and --etcd-cacert), \
                 as etcd run with --client-cert-auth requires, or pass --insecure-etcd to accept an \
                 etcd that does not authenticate its clients"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// `https://` in any letter case (URL schemes are case-insensitive).
fn is_https(endpoint: &str) -> bool {
    endpoint.get(..8).is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
}

impl EtcdError {
    /// True if etcd answered that the thing asked about does not exist (e.g. a lease already gone).
    pub fn is_not_found(&self) -> bool {
        matches!(self, EtcdError::Client(etcd_client::Error::GRpcStatus(s)) if s.code() == tonic::Code::NotFound)
    }
}

/// Connects to etcd with TLS and a client certificate, or, only with `tls.insecure`, however
/// the settings say (plaintext `http://` endpoints included; warned about). With TLS files every
/// endpoint must be `https://`: a plaintext endpoint would silently skip them. Connecting is
/// lazy: this succeeds while etcd is down, and the client reconnects by itself when it returns.
pub async fn connect_with_tls(endpoints: &[String], tls: &EtcdTls) -> Result<Client, EtcdError> {
    tls.check_authenticated(endpoints)?;
    if tls.is_enabled() {
        if let Some(plain) = endpoints.iter().find(|e| !is_https(e)) {
            return Err(EtcdError::Tls(format!(
                "endpoint {} is not https:// but etcd TLS files were given",
                logged(plain)
            )));
        }
    }
    if tls.insecure {
        tracing::warn!(
            "--insecure-etcd: etcd access may be unauthenticated; whoever can write etcd chooses the \
             leader frontends follow and the members they hash proxies onto"
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> EtcdTls {
        EtcdTls { ca: Some("ca.pem".into()), cert: Some("c.pem".into()), key: Some("k.pem".into()), insecure: false }
    }

    #[test]
    fn plaintext_endpoints_are_refused_unless_insecure() {
        let plain = vec!["http://127.0.0.1:2379".to_string()];
        let err = EtcdTls::default().check_authenticated(&plain).expect_err("plaintext refused");
        let text = err.to_string();
        assert!(text.contains("--insecure-etcd") && text.contains("--etcd-cert"), "{text}");
        let bare = vec!["127.0.0.1:2379".to_string()];
        assert!(files().check_authenticated(&bare).is_err(), "a scheme-less endpoint is plaintext");
        let insecure = EtcdTls { insecure: true, ..Default::default() };
        assert!(insecure.check_authenticated(&plain).is_ok());
    }

    #[test]
    fn tls_without_a_client_certificate_is_refused_unless_insecure() {
        let https = vec!["https://etcd:2379".to_string(), "HTTPS://etcd-1:2379".to_string()];
        let server_only = EtcdTls { ca: Some("ca.pem".into()), ..Default::default() };
        let text = server_only.check_authenticated(&https).expect_err("no client certificate").to_string();
        assert!(text.contains("--etcd-cert and --etcd-key"), "{text}");
        assert!(files().check_authenticated(&https).is_ok());
        assert!(EtcdTls { insecure: true, ..server_only }.check_authenticated(&https).is_ok());
    }

    #[test]
    fn an_endpoint_in_an_error_is_escaped() {
        let forged = vec!["http://x\n{\"level\":\"INFO\"}".to_string()];
        let text = EtcdTls::default().check_authenticated(&forged).expect_err("refused").to_string();
        assert!(!text.contains('\n'), "{text}");
    }

    #[tokio::test]
    async fn connecting_checks_before_dialling() {
        let plain = vec!["http://127.0.0.1:1".to_string()];
        assert!(matches!(connect_with_tls(&plain, &EtcdTls::default()).await, Err(EtcdError::Unauthenticated(_))));
    }
}
