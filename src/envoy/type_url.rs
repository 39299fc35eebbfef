//! The xDS resource types translation produces.

use std::fmt;

/// The xDS resource types meshpilot serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum TypeUrl {
    /// CDS.
    Cluster,
    /// EDS.
    Endpoint,
    /// LDS.
    Listener,
    /// RDS.
    Route,
    /// SDS (gateway credentials the control plane serves itself).
    Secret,
}

impl TypeUrl {
    /// Push order: clusters before endpoints, listeners before routes (Envoy's warming order).
    /// Secrets last, as Istio: Envoy asks for them while warming the listeners that name them.
    pub const PUSH_ORDER: [TypeUrl; 5] =
        [TypeUrl::Cluster, TypeUrl::Endpoint, TypeUrl::Listener, TypeUrl::Route, TypeUrl::Secret];

    /// The full type URL.
    pub fn as_str(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            TypeUrl::Endpoint => "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            TypeUrl::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            TypeUrl::Route => "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
            TypeUrl::Secret => "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        }
    }

    /// Parses a type URL.
    pub fn parse(url: &str) -> Option<TypeUrl> {
        Self::PUSH_ORDER.into_iter().find(|t| t.as_str() == url)
    }

    /// Istio's short name, used as the `type` metric label (cds, eds, lds, rds, sds).
    pub fn short(self) -> &'static str {
        match self {
            TypeUrl::Cluster => "cds",
            TypeUrl::Endpoint => "eds",
            TypeUrl::Listener => "lds",
            TypeUrl::Route => "rds",
            TypeUrl::Secret => "sds",
        }
    }

    /// Whether the proxy names the resources it wants (EDS, RDS, SDS) rather than getting all (CDS, LDS).
    pub fn is_named(self) -> bool {
        matches!(self, TypeUrl::Endpoint | TypeUrl::Route | TypeUrl::Secret)
    }
}

impl fmt::Display for TypeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short())
    }
}
