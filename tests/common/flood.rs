//! Idle TCP connections that never send a byte (no ClientHello), held open until dropped.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

/// Connections opened to one address, closed when dropped.
pub struct IdleFlood {
    /// The connections the server accepted (a connect that did not complete in time is not kept).
    pub held: Vec<TcpStream>,
}

/// Opens `count` connections to `addr` that send nothing, `parallel` at a time; a connect that
/// does not complete within a second (the server's backlog is full) is given up.
pub async fn idle_connections(addr: SocketAddr, count: usize, parallel: usize) -> IdleFlood {
    let mut held = Vec::with_capacity(count);
    let mut tasks = tokio::task::JoinSet::new();
    let mut started = 0;
    while started < count || !tasks.is_empty() {
        while started < count && tasks.len() < parallel {
            started += 1;
            tasks.spawn(async move { tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(addr)).await });
        }
        if let Some(Ok(Ok(Ok(stream)))) = tasks.join_next().await {
            held.push(stream);
        }
    }
    IdleFlood { held }
}
