//! The key a proxy is hashed by.

use crate::xds::proxy::Proxy;

/// What identifies a proxy for consistent hashing. Proxies with the same key land on the same
/// frontend; keys that group proxies receiving the same config make frontends share generations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProxyKey {
    /// `namespace/serviceAccount`; without a service account `namespace/app-label`
    /// (`app`, else `app.kubernetes.io/name`); without either, the node id.
    #[default]
    ServiceAccount,
    /// The full node id: spreads proxies evenly, shares nothing.
    NodeId,
}

impl ProxyKey {
    /// The key of `proxy`.
    pub fn of(&self, proxy: &Proxy) -> String {
        match self {
            ProxyKey::NodeId => proxy.id.clone(),
            ProxyKey::ServiceAccount => {
                let app = || proxy.labels.get("app").or_else(|| proxy.labels.get("app.kubernetes.io/name"));
                if !proxy.service_account.is_empty() {
                    format!("{}/{}", proxy.namespace, proxy.service_account)
                } else if let Some(app) = app().filter(|a| !a.is_empty()) {
                    format!("{}/{}", proxy.namespace, app)
                } else {
                    proxy.id.clone()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

    use super::*;

    fn proxy(meta: &[(&str, Value)]) -> Proxy {
        let node = Node {
            id: "sidecar~10.0.0.1~reviews-1.bookinfo~bookinfo.svc.cluster.local".into(),
            metadata: Some(Struct { fields: meta.iter().map(|(k, v)| (k.to_string(), v.clone())).collect() }),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    fn s(v: &str) -> Value {
        Value { kind: Some(Kind::StringValue(v.into())) }
    }

    fn labels(pairs: &[(&str, &str)]) -> Value {
        let fields = pairs.iter().map(|(k, v)| (k.to_string(), s(v))).collect();
        Value { kind: Some(Kind::StructValue(Struct { fields })) }
    }

    #[test]
    fn service_account_then_app_label_then_node_id() {
        let p = proxy(&[("SERVICE_ACCOUNT", s("bookinfo-reviews")), ("LABELS", labels(&[("app", "reviews")]))]);
        assert_eq!(ProxyKey::ServiceAccount.of(&p), "bookinfo/bookinfo-reviews");
        let p = proxy(&[("LABELS", labels(&[("app.kubernetes.io/name", "reviews")]))]);
        assert_eq!(ProxyKey::ServiceAccount.of(&p), "bookinfo/reviews");
        let p = proxy(&[]);
        assert_eq!(ProxyKey::ServiceAccount.of(&p), p.id);
        assert_eq!(ProxyKey::NodeId.of(&p), p.id);
    }
}
