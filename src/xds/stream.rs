//! One ADS stream, whatever its protocol: the first request's node checks, the readiness gate,
//! the request rate, pushes of new snapshots in Envoy's warming order, and the drain. The
//! protocols (state of the world in `connection`, delta in `delta`) only answer requests and
//! compute one type's response.

use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::warn;

use super::limits::{self, RequestRate};
use super::proxy::Proxy;
use super::session::Session;
use super::TypeUrl;
use crate::snapshot::Snapshot;
use crate::telemetry::log_text::Untrusted;

// The stream's types live beside it, where the protocols and the debug types can use them
// without a ring through the stream loop; their paths through `stream` stay as they were.
pub use super::protocol::Protocol;
pub use super::stream_context::{over_limit, Caller, ConnectionContext, StreamEnd};

/// Serves one ADS stream of protocol `P` from an unauthenticated caller until it ends.
pub async fn serve<P, S>(
    ctx: ConnectionContext,
    protocol: P,
    requests: S,
    tx: mpsc::Sender<Result<P::Response, Status>>,
) -> StreamEnd
where
    P: Protocol,
    S: Stream<Item = Result<P::Request, Status>> + Unpin,
{
    serve_as(ctx, Caller::Unauthenticated, protocol, requests, tx).await
}

/// Serves one ADS stream of protocol `P` from `caller` until it ends; a node the caller may not
/// claim gets nothing.
pub async fn serve_as<P, S>(
    ctx: ConnectionContext,
    caller: Caller,
    mut protocol: P,
    mut requests: S,
    tx: mpsc::Sender<Result<P::Response, Status>>,
) -> StreamEnd
where
    P: Protocol,
    S: Stream<Item = Result<P::Request, Status>> + Unpin,
{
    let first = match requests.next().await {
        Some(Ok(r)) => r,
        Some(Err(status)) => return refuse(&tx, status).await,
        None => return StreamEnd::Closed,
    };
    if let Some(node) = P::node(&first) {
        if let Err(e) = limits::check_node(node) {
            return refuse(&tx, Status::resource_exhausted(e.to_string())).await;
        }
    }
    if super::debug::is_debug_type(P::type_url(&first)) {
        ctx.admission.admit_stream().await;
        return super::debug::serve::<P, S>(ctx, &caller, first, requests, tx).await;
    }
    let mut proxy = match Proxy::from_node(P::node(&first)) {
        Ok(p) => p,
        Err(e) => return refuse(&tx, Status::invalid_argument(e.to_string())).await,
    };
    if let Err(status) = caller.authorize(&proxy) {
        return refuse(&tx, status).await;
    }
    // Authorized above: an authenticated caller holds an identity of the node's namespace.
    proxy.verified = caller.is_authenticated();
    // A storm of new streams waits here, before any generation, while pushes go on.
    ctx.admission.admit_stream().await;
    let deadline = ctx.admission.stream_deadline(age_seed(&proxy.id));
    let mut session = match Session::new(ctx.clone(), proxy, P::TRANSPORT, tx.clone()) {
        Ok(session) => session,
        Err(over) => return refuse(&tx, Status::resource_exhausted(over.to_string())).await,
    };
    let mut snapshots = ctx.snapshots.clone();
    let drain = ctx.drain.clone();
    let mut rate = RequestRate::default();
    // Made once, not per turn of the loop: every snapshot wakes every stream, and each new drain
    // or deadline future would register with the drain's channel and the timer again.
    let draining = drain.draining();
    let aged = until(deadline);
    tokio::pin!(draining, aged);
    let end = async {
        rate.acquire().await;
        protocol.on_request(&mut session, first).await?;
        loop {
            tokio::select! {
                // In this order: the drain, then a snapshot, then requests. A stream woken by a
                // snapshot handles it without polling its request stream (which locks the
                // connection's HTTP/2 state) on the way.
                biased;
                _ = &mut draining => return Err(StreamEnd::Draining),
                snap = snapshots.next() => match snap {
                    Some(s) => push_snapshot(&mut protocol, &mut session, s).await?,
                    // The snapshot writer is gone (shutdown): keep serving what we have until the proxy leaves.
                    None => std::future::pending::<()>().await,
                },
                req = requests.next() => match req {
                    Some(Ok(r)) => {
                        // A stream over its rate waits here; HTTP/2 flow control slows the client.
                        rate.acquire().await;
                        protocol.on_request(&mut session, r).await?
                    }
                    Some(Err(status)) => return Err(StreamEnd::Refused(status)),
                    None => return Err(StreamEnd::Closed),
                },
                _ = &mut aged => return Err(StreamEnd::MaxAge),
            }
        }
    }
    .await;
    let end = match end {
        Ok(()) => StreamEnd::Closed,
        Err(e) => e,
    };
    session.close(&end);
    end
}

/// Sleeps until `deadline`; never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A per-stream jitter seed: the node id and the time it connected.
fn age_seed(node_id: &str) -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    xxhash_rust::xxh64::xxh64(node_id.as_bytes(), u64::from(nanos))
}

/// Pushes a new snapshot: each subscribed type in Envoy's warming order, then what had to wait.
async fn push_snapshot<P: Protocol>(
    protocol: &mut P,
    session: &mut Session<P::Response>,
    snapshot: Arc<Snapshot>,
) -> Result<(), StreamEnd> {
    let queued_at = Instant::now();
    session.use_snapshot(snapshot.clone());
    // Most streams, on most snapshots: nothing they hold changes. They take the snapshot without
    // a push slot, and the streams with something to send are not queued behind them.
    if protocol.settled() && !session.concerned() {
        session.pushed(&snapshot, false, queued_at);
        return Ok(());
    }
    let admission = session.ctx.admission.clone();
    let _slot = admission.push_permit().await;
    protocol.on_new_snapshot();
    let mut pushed = false;
    for type_url in TypeUrl::PUSH_ORDER {
        if protocol.watches(type_url) {
            pushed |= protocol.push(session, type_url).await?;
        }
    }
    pushed |= protocol.finish_push(session).await?;
    session.pushed(&snapshot, pushed, queued_at);
    Ok(())
}

/// Ends a stream before it was registered: the client gets `status`, not OK.
async fn refuse<R>(tx: &mpsc::Sender<Result<R, Status>>, status: Status) -> StreamEnd {
    warn!(code = ?status.code(), reason = %Untrusted(status.message()), "xDS stream refused");
    let _ = tx.send(Err(status.clone())).await;
    StreamEnd::Refused(status)
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::Node;

    use super::*;
    use crate::security::Identity;

    fn proxy(id: &str, service_account: Option<&str>) -> Proxy {
        let metadata = service_account.map(|sa| {
            let mut fields = std::collections::HashMap::new();
            fields.insert(
                "SERVICE_ACCOUNT".to_string(),
                envoy_types::pb::google::protobuf::Value {
                    kind: Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(sa.to_string())),
                },
            );
            envoy_types::pb::google::protobuf::Struct { fields }
        });
        Proxy::from_node(Some(&Node { id: id.into(), metadata, ..Default::default() })).expect("a proxy")
    }

    fn caller(uri: &str) -> Caller {
        Caller::Authenticated(vec![Identity::parse(uri).expect("identity")])
    }

    #[test]
    fn a_caller_may_claim_only_its_own_namespace_and_service_account() {
        let a = caller("spiffe://cluster.local/ns/ns-a/sa/reviews");
        assert!(a.authorize(&proxy("sidecar~10.0.0.1~r-1.ns-a~ns-a.svc.cluster.local", Some("reviews"))).is_ok());
        // No service account claimed: the namespace decides, as in istiod.
        assert!(a.authorize(&proxy("sidecar~10.0.0.1~r-1.ns-a~ns-a.svc.cluster.local", None)).is_ok());
        let other_ns = a.authorize(&proxy("sidecar~10.0.0.1~r-1.ns-b~ns-b.svc.cluster.local", Some("reviews")));
        assert_eq!(other_ns.expect_err("refused").code(), tonic::Code::PermissionDenied);
        let other_sa = a.authorize(&proxy("sidecar~10.0.0.1~r-1.ns-a~ns-a.svc.cluster.local", Some("ratings")));
        assert_eq!(other_sa.expect_err("refused").code(), tonic::Code::PermissionDenied);
        assert!(Caller::Authenticated(Vec::new()).authorize(&proxy("sidecar~1.1.1.1~p.ns-a~ns-a.svc", None)).is_err());
        assert!(Caller::Unauthenticated.authorize(&proxy("sidecar~1.1.1.1~p.ns-b~ns-b.svc", None)).is_ok());
    }
}
