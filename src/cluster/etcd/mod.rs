//! etcd plumbing shared by leader election and membership: connecting, bounded requests,
//! kept-alive leases.

mod lease;

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

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
    // HTTP/2 pings detect a silently dead connection under open streams (watches). etcd
    // refuses pings more often than every 5 s (--grpc-keepalive-min-time) and pings without
    // streams, hence these values.
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(false);
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
