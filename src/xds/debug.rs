//! Istio's debug types over ADS (`istio.io/debug/syncz`, `istio.io/debug/config_dump`), which
//! `istioctl proxy-status --xds-address` and `istioctl x proxy-status` ask a control plane for.
//! A stream whose first request names one is a debug client: each request gets one answer, and
//! the client is never listed as a proxy.

use std::sync::Arc;

use envoy_types::pb::envoy::admin::v3::UpdateFailureState;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::status::v3::{client_config::GenericXdsConfig, ClientConfig, ConfigStatus};
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, Any, Struct, Value};
use futures::{Stream, StreamExt};
use prost::{Message, Name};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::debug;

use super::dump::{self, DumpedType};
use super::protocol::{DebugResource, Protocol};
use super::status::{ConnectionStatus, TypeStatus};
use super::stream_context::{Caller, ConnectionContext, StreamEnd};
use super::TypeUrl;
use crate::telemetry::log_text::Untrusted;

/// What every debug type URL starts with.
pub const PREFIX: &str = "istio.io/debug/";
/// Every connected proxy's sync state per type, as Envoy's CSDS `ClientConfig`s.
pub const SYNCZ: &str = "istio.io/debug/syncz";
/// The `ConfigDump` sections of the one proxy named (`pod.namespace` or node id).
pub const CONFIG_DUMP: &str = "istio.io/debug/config_dump";

/// The control-plane identifier answers carry, as istiod's: JSON naming this server, which
/// istioctl shows in its ISTIOD column.
pub fn control_plane_identifier(server_id: &str) -> String {
    serde_json::json!({
        "Component": "meshpilot",
        "ID": server_id,
        "Info": {"version": env!("CARGO_PKG_VERSION")},
    })
    .to_string()
}

/// Whether `type_url` is one of Istio's debug types.
pub fn is_debug_type(type_url: &str) -> bool {
    type_url.starts_with(PREFIX)
}

/// Which proxies a debug client may see. As istiod: a caller on the secure port sees the proxies
/// of its own namespaces, unless one of its identities is of the control plane's (root)
/// namespace; the plaintext port is for local use and sees all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebugScope {
    /// Every proxy.
    All,
    /// The proxies of these namespaces.
    Namespaces(Vec<String>),
}

impl DebugScope {
    /// The scope of `caller`, given the mesh's root namespace.
    pub fn of(caller: &Caller, root_namespace: &str) -> DebugScope {
        match caller {
            Caller::Unauthenticated => DebugScope::All,
            Caller::Authenticated(ids) if ids.iter().any(|id| id.namespace() == root_namespace) => DebugScope::All,
            Caller::Authenticated(ids) => {
                DebugScope::Namespaces(ids.iter().map(|id| id.namespace().to_string()).collect())
            }
        }
    }

    /// Whether a proxy of `namespace` is in scope.
    pub fn covers(&self, namespace: &str) -> bool {
        match self {
            DebugScope::All => true,
            DebugScope::Namespaces(namespaces) => namespaces.iter().any(|n| n == namespace),
        }
    }
}

/// Serves a debug client's stream: answers each request until the client closes it.
pub async fn serve<P, S>(
    ctx: ConnectionContext,
    caller: &Caller,
    first: P::Request,
    mut requests: S,
    tx: mpsc::Sender<Result<P::Response, Status>>,
) -> StreamEnd
where
    P: Protocol,
    S: Stream<Item = Result<P::Request, Status>> + Unpin,
{
    let mut nonces: u64 = 0;
    let root = ctx.snapshots.current().map(|s| s.mesh.root_namespace.clone()).unwrap_or_else(|| "istio-system".into());
    let scope = DebugScope::of(caller, &root);
    let mut request = first;
    loop {
        let type_url = P::type_url(&request);
        if is_debug_type(type_url) {
            nonces += 1;
            let nonce = nonces.to_string();
            let response = match answer(&ctx, &scope, type_url, P::debug_names(&request)).await {
                Ok(resources) => Ok(P::debug_response(type_url, &nonce, &ctx.control_plane, resources)),
                Err(status) => Err(status),
            };
            let failed = response.is_err();
            if tx.send(response).await.is_err() {
                return StreamEnd::Dropped;
            }
            if failed {
                return StreamEnd::Invalid(format!("debug request for {} refused", Untrusted(type_url)));
            }
        } else {
            debug!(type_url = %Untrusted(type_url), "a debug client asked for a config type; ignored");
        }
        request = match requests.next().await {
            Some(Ok(r)) => r,
            Some(Err(status)) => return StreamEnd::Refused(status),
            None => return StreamEnd::Closed,
        };
    }
}

/// The resources answering a request for `type_url` naming `names`, of the proxies in `scope`.
pub async fn answer(
    ctx: &ConnectionContext,
    scope: &DebugScope,
    type_url: &str,
    names: &[String],
) -> Result<Vec<DebugResource>, Status> {
    match type_url {
        SYNCZ => Ok(ctx
            .registry
            .snapshot()
            .iter()
            .filter(|c| scope.covers(&c.proxy.namespace))
            .map(|c| client_config(c))
            .collect()),
        CONFIG_DUMP => {
            let [name] = names else {
                return Err(Status::invalid_argument(format!(
                    "{CONFIG_DUMP} needs exactly one resource name (pod.namespace or node id), got {}",
                    names.len()
                )));
            };
            let connections = ctx.registry.snapshot();
            // A proxy out of scope is answered as one not connected: its existence is not told.
            let conn = find_proxy(&connections, name)
                .filter(|c| scope.covers(&c.proxy.namespace))
                .ok_or_else(|| Status::not_found(format!("proxy {} is not connected here", Untrusted(name))))?;
            let snap = ctx.snapshots.current().ok_or_else(|| Status::unavailable("no snapshot yet"))?;
            let view = crate::envoy::SharedView::new(conn.proxy.view());
            let mut generated = Vec::new();
            for type_url in TypeUrl::PUSH_ORDER {
                generated.push((type_url, ctx.cache.get(&snap, &view, type_url).await));
            }
            let types: Vec<DumpedType<'_>> = generated
                .iter()
                .map(|(t, g)| DumpedType { type_url: *t, generated: g, status: conn.types.get(t) })
                .collect();
            // As istiod answers: each section of the dump is a resource of its own.
            Ok(dump::config_dump(&types).configs.into_iter().map(|section| (String::new(), section)).collect())
        }
        other => Err(Status::unimplemented(format!("debug type {} is not served", Untrusted(other)))),
    }
}

/// The connection of the proxy named `name`: its node id, or `pod.namespace` as istioctl names it.
pub fn find_proxy<'a>(connections: &'a [Arc<ConnectionStatus>], name: &str) -> Option<&'a Arc<ConnectionStatus>> {
    connections.iter().find(|c| c.proxy.id == name || c.proxy.id.split('~').nth(2) == Some(name))
}

/// Istio's sync state of one type: ERROR after a rejection, NOT_SENT before the first response,
/// SYNCED once the last response was acknowledged, STALE while it is not.
pub fn config_status(t: &TypeStatus) -> ConfigStatus {
    if t.last_nack.is_some() {
        ConfigStatus::Error
    } else if t.sent_nonce.is_empty() {
        ConfigStatus::NotSent
    } else if t.acked_nonce == t.sent_nonce {
        ConfigStatus::Synced
    } else {
        ConfigStatus::Stale
    }
}

/// A proxy's `ClientConfig`: its node (id, cluster, namespace, Istio version) and each type's state.
fn client_config(conn: &ConnectionStatus) -> DebugResource {
    let string = |s: &str| Value { kind: Some(ValueKind::StringValue(s.to_string())) };
    let metadata = Struct {
        fields: [
            ("CLUSTER_ID".to_string(), string(&conn.proxy.cluster_id)),
            ("NAMESPACE".to_string(), string(&conn.proxy.namespace)),
            ("ISTIO_VERSION".to_string(), string(&conn.proxy.istio_version)),
        ]
        .into_iter()
        .collect(),
    };
    let generic_xds_configs = conn
        .types
        .iter()
        .map(|(type_url, t)| GenericXdsConfig {
            type_url: type_url.as_str().to_string(),
            version_info: t.acked_version.clone(),
            config_status: config_status(t) as i32,
            last_updated: t.sent_at.map(dump::timestamp),
            error_state: t.last_nack.as_ref().map(|n| UpdateFailureState {
                last_update_attempt: Some(dump::timestamp(n.at)),
                details: n.message.clone(),
                version_info: n.version.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    let config = ClientConfig {
        node: Some(Node { id: conn.proxy.id.clone(), metadata: Some(metadata), ..Default::default() }),
        generic_xds_configs,
        ..Default::default()
    };
    (conn.proxy.id.clone(), pack(&config))
}

fn pack<M: Message + Name>(message: &M) -> Any {
    Any { type_url: M::type_url(), value: message.encode_to_vec() }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::xds::status::Nack;

    #[test]
    fn status_follows_istio() {
        let mut t = TypeStatus::default();
        assert_eq!(config_status(&t), ConfigStatus::NotSent);
        t.sent_nonce = "2".into();
        t.acked_nonce = "1".into();
        assert_eq!(config_status(&t), ConfigStatus::Stale);
        t.acked_nonce = "2".into();
        assert_eq!(config_status(&t), ConfigStatus::Synced);
        t.last_nack =
            Some(Nack { version: "1.2".into(), nonce: "2".into(), message: "bad".into(), at: SystemTime::now() });
        assert_eq!(config_status(&t), ConfigStatus::Error);
    }

    #[test]
    fn secure_callers_see_their_own_namespaces_unless_of_the_root_namespace() {
        use crate::security::Identity;
        let id = |ns: &str| Identity::parse(&format!("spiffe://cluster.local/ns/{ns}/sa/x")).expect("valid");
        assert_eq!(DebugScope::of(&Caller::Unauthenticated, "istio-system"), DebugScope::All);
        let shop = DebugScope::of(&Caller::Authenticated(vec![id("shop")]), "istio-system");
        assert!(shop.covers("shop") && !shop.covers("bank"));
        let admin = DebugScope::of(&Caller::Authenticated(vec![id("istio-system")]), "istio-system");
        assert!(admin.covers("bank"));
    }

    #[test]
    fn only_debug_types_are_debug_types() {
        assert!(is_debug_type(SYNCZ) && is_debug_type(CONFIG_DUMP));
        assert!(!is_debug_type(TypeUrl::Cluster.as_str()));
    }
}
