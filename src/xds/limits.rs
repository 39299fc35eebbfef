//! What one xDS client may send: message size, resource names, node size, request rate. Anything
//! past a limit ends only that stream, with a status saying which limit; the rest of the mesh
//! keeps being served. Defaults leave room for the largest real meshes (tens of thousands of
//! EDS names per request) while bounding what an unauthenticated client can make us hold.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use prost::Message;
use tokio::time::Instant;

/// Largest request message a proxy may send (gRPC decoding limit).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Most resource names in one request.
pub const MAX_RESOURCE_NAMES: usize = 50_000;
/// Longest node id (Istio's are `type~ip~pod.ns~ns.svc.domain`, well under this).
pub const MAX_NODE_ID_BYTES: usize = 1024;
/// Largest encoded node (id, metadata, locality, ...).
pub const MAX_NODE_BYTES: usize = 64 * 1024;
/// Characters of a NACK's error detail kept (`/debug/syncz`, `/debug/rejected`, the push trace)
/// and logged; the same bound as every client text in logs (`telemetry::log_text`).
pub const MAX_NACK_DETAIL_CHARS: usize = crate::telemetry::log_text::MAX_CHARS;
/// Characters of a NACK's error detail searched for the names of the resources it rejects
/// (Envoy's name them near the start; a longer detail is not read further).
pub const MAX_NACK_SCANNED_CHARS: usize = 4096;
/// Sustained requests per second a stream may send; faster ones wait (HTTP/2 back-pressure).
pub const REQUESTS_PER_SECOND: f64 = 50.0;
/// Requests a stream may send in a burst before the rate applies.
pub const REQUEST_BURST: f64 = 200.0;

/// A limit a request broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Too many resource names.
    #[error("request names {count} resources; at most {MAX_RESOURCE_NAMES} are accepted")]
    ResourceNames {
        /// Names in the request.
        count: usize,
    },
    /// The node id is too long.
    #[error("node id is {len} bytes; at most {MAX_NODE_ID_BYTES} are accepted")]
    NodeId {
        /// Its length.
        len: usize,
    },
    /// The node is too large.
    #[error("node is {len} bytes encoded; at most {MAX_NODE_BYTES} are accepted")]
    Node {
        /// Its encoded length.
        len: usize,
    },
}

/// Checks the node of a stream's first request.
pub fn check_node(node: &Node) -> Result<(), LimitError> {
    if node.id.len() > MAX_NODE_ID_BYTES {
        return Err(LimitError::NodeId { len: node.id.len() });
    }
    let len = node.encoded_len();
    if len > MAX_NODE_BYTES {
        return Err(LimitError::Node { len });
    }
    Ok(())
}

/// Checks the resource names of a request.
pub fn check_names(count: usize) -> Result<(), LimitError> {
    if count > MAX_RESOURCE_NAMES {
        return Err(LimitError::ResourceNames { count });
    }
    Ok(())
}

/// A token bucket per stream: each request takes a token; without one, the stream waits.
#[derive(Debug)]
pub struct RequestRate {
    tokens: f64,
    last: Instant,
}

impl Default for RequestRate {
    fn default() -> Self {
        RequestRate { tokens: REQUEST_BURST, last: Instant::now() }
    }
}

impl RequestRate {
    /// Takes a token, first waiting as long as the rate asks.
    pub async fn acquire(&mut self) {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * REQUESTS_PER_SECOND).min(REQUEST_BURST);
        self.last = now;
        if self.tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / REQUESTS_PER_SECOND);
            tokio::time::sleep(wait).await;
            self.tokens = 1.0;
            self.last = Instant::now();
        }
        self.tokens -= 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_and_names_are_bounded() {
        let node = Node { id: "x".repeat(MAX_NODE_ID_BYTES + 1), ..Default::default() };
        assert_eq!(check_node(&node), Err(LimitError::NodeId { len: MAX_NODE_ID_BYTES + 1 }));
        assert!(check_node(&Node { id: "sidecar~1~a.b~b.svc".into(), ..Default::default() }).is_ok());
        assert!(check_names(MAX_RESOURCE_NAMES).is_ok());
        assert!(check_names(MAX_RESOURCE_NAMES + 1).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fast_stream_is_slowed_to_the_rate() {
        let mut rate = RequestRate::default();
        let started = Instant::now();
        for _ in 0..(REQUEST_BURST as usize + 100) {
            rate.acquire().await;
        }
        let took = started.elapsed().as_secs_f64();
        // The burst is free; the next 100 requests take 100 / rate seconds.
        assert!((took - 100.0 / REQUESTS_PER_SECOND).abs() < 0.1, "took {took}");
    }
}
