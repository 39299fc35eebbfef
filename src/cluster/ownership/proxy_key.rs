//! The key a proxy is hashed by.

/// What the key of a proxy is made of, as its node id and metadata give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyIdentity<'a> {
    /// Full node id.
    pub node_id: &'a str,
    /// Namespace.
    pub namespace: &'a str,
    /// Service account (may be empty).
    pub service_account: &'a str,
    /// The `app` label, else `app.kubernetes.io/name`, if any.
    pub app: Option<&'a str>,
}

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
    /// The key of the proxy `who` describes.
    pub fn of(&self, who: &ProxyIdentity<'_>) -> String {
        match self {
            ProxyKey::NodeId => who.node_id.to_string(),
            ProxyKey::ServiceAccount => {
                if !who.service_account.is_empty() {
                    format!("{}/{}", who.namespace, who.service_account)
                } else if let Some(app) = who.app.filter(|a| !a.is_empty()) {
                    format!("{}/{}", who.namespace, app)
                } else {
                    who.node_id.to_string()
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "sidecar~10.0.0.1~reviews-1.bookinfo~bookinfo.svc.cluster.local";

    fn who(service_account: &'static str, app: Option<&'static str>) -> ProxyIdentity<'static> {
        ProxyIdentity { node_id: ID, namespace: "bookinfo", service_account, app }
    }

    #[test]
    fn service_account_then_app_label_then_node_id() {
        assert_eq!(ProxyKey::ServiceAccount.of(&who("bookinfo-reviews", Some("reviews"))), "bookinfo/bookinfo-reviews");
        assert_eq!(ProxyKey::ServiceAccount.of(&who("", Some("reviews"))), "bookinfo/reviews");
        assert_eq!(ProxyKey::ServiceAccount.of(&who("", Some(""))), ID);
        assert_eq!(ProxyKey::ServiceAccount.of(&who("", None)), ID);
        assert_eq!(ProxyKey::NodeId.of(&who("sa", None)), ID);
    }
}
