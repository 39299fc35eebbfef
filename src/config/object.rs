//! A typed config object: kind, identity and spec.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::api;

/// Istio networking API group served by meshpilot.
pub const NETWORKING_GROUP: &str = "networking.istio.io";

/// API versions of the networking group that share one schema.
pub const NETWORKING_VERSIONS: [&str; 3] = ["v1", "v1beta1", "v1alpha3"];

/// Istio security API group.
pub const SECURITY_GROUP: &str = "security.istio.io";

/// API versions of the security group that share one schema.
pub const SECURITY_VERSIONS: [&str; 2] = ["v1", "v1beta1"];

/// The kinds meshpilot serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// VirtualService.
    VirtualService,
    /// DestinationRule.
    DestinationRule,
    /// Gateway.
    Gateway,
    /// ServiceEntry.
    ServiceEntry,
    /// WorkloadEntry.
    WorkloadEntry,
    /// Sidecar.
    Sidecar,
    /// AuthorizationPolicy (security.istio.io).
    AuthorizationPolicy,
    /// RequestAuthentication (security.istio.io).
    RequestAuthentication,
    /// PeerAuthentication (security.istio.io).
    PeerAuthentication,
}

impl Kind {
    /// All kinds, in a stable order.
    pub const ALL: [Kind; 9] = [
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::Gateway,
        Kind::ServiceEntry,
        Kind::WorkloadEntry,
        Kind::Sidecar,
        Kind::AuthorizationPolicy,
        Kind::RequestAuthentication,
        Kind::PeerAuthentication,
    ];

    /// Parses a `kind:` value.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The `kind:` value.
    pub fn name(self) -> &'static str {
        match self {
            Kind::VirtualService => "VirtualService",
            Kind::DestinationRule => "DestinationRule",
            Kind::Gateway => "Gateway",
            Kind::ServiceEntry => "ServiceEntry",
            Kind::WorkloadEntry => "WorkloadEntry",
            Kind::Sidecar => "Sidecar",
            Kind::AuthorizationPolicy => "AuthorizationPolicy",
            Kind::RequestAuthentication => "RequestAuthentication",
            Kind::PeerAuthentication => "PeerAuthentication",
        }
    }

    /// The API group and the versions of it that share this kind's schema.
    pub fn group(self) -> (&'static str, &'static [&'static str]) {
        match self {
            Kind::AuthorizationPolicy | Kind::RequestAuthentication | Kind::PeerAuthentication => {
                (SECURITY_GROUP, &SECURITY_VERSIONS)
            }
            _ => (NETWORKING_GROUP, &NETWORKING_VERSIONS),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Identity of a config object: kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ConfigKey {
    /// Kind.
    pub kind: Kind,
    /// Namespace (defaulted when the document has none).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// Object metadata that matters to routing.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Meta {
    /// Labels.
    pub labels: api::Labels,
    /// Annotations.
    pub annotations: api::Labels,
    /// The `apiVersion` it was written with.
    pub api_version: String,
}

/// The spec, by kind.
// Specs live behind `Arc` (ValidConfig) once validated, so the variant size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Spec {
    /// VirtualService.
    VirtualService(api::VirtualService),
    /// DestinationRule.
    DestinationRule(api::DestinationRule),
    /// Gateway.
    Gateway(api::Gateway),
    /// ServiceEntry.
    ServiceEntry(api::ServiceEntry),
    /// WorkloadEntry.
    WorkloadEntry(api::WorkloadEntry),
    /// Sidecar.
    Sidecar(api::Sidecar),
    /// AuthorizationPolicy.
    AuthorizationPolicy(api::AuthorizationPolicy),
    /// RequestAuthentication.
    RequestAuthentication(api::RequestAuthentication),
    /// PeerAuthentication.
    PeerAuthentication(api::PeerAuthentication),
}

impl Spec {
    /// The kind of this spec.
    pub fn kind(&self) -> Kind {
        match self {
            Spec::VirtualService(_) => Kind::VirtualService,
            Spec::DestinationRule(_) => Kind::DestinationRule,
            Spec::Gateway(_) => Kind::Gateway,
            Spec::ServiceEntry(_) => Kind::ServiceEntry,
            Spec::WorkloadEntry(_) => Kind::WorkloadEntry,
            Spec::Sidecar(_) => Kind::Sidecar,
            Spec::AuthorizationPolicy(_) => Kind::AuthorizationPolicy,
            Spec::RequestAuthentication(_) => Kind::RequestAuthentication,
            Spec::PeerAuthentication(_) => Kind::PeerAuthentication,
        }
    }
}

/// A parsed (not yet validated) config object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfigObject {
    /// Identity.
    pub key: ConfigKey,
    /// Metadata.
    pub meta: Meta,
    /// Spec.
    pub spec: Spec,
}

/// A config object that passed validation; shared, immutable.
pub type ValidConfig = Arc<ConfigObject>;

/// Valid config objects by key, as a persistent map: a snapshot's copy is O(1) and shares every
/// node its successor does not change (a one-object edit copies one path, not the map).
pub type ConfigObjects = imbl::OrdMap<ConfigKey, ValidConfig>;
