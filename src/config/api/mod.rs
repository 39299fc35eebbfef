//! Istio API types: networking.istio.io (v1, v1beta1, v1alpha3 share one schema) and
//! security.istio.io (v1, v1beta1).
//!
//! Field names follow Istio's JSON form. Unknown fields are dropped as Istio's decoding drops them
//! (`config::decode` reports them: a warning for networking kinds, an error for security policies).

pub mod authorization_policy;
pub mod common;
pub mod destination_rule;
pub mod gateway;
pub mod peer_authentication;
pub mod request_authentication;
pub mod service_entry;
pub mod sidecar;
pub mod virtual_service;
pub mod workload_entry;

pub use authorization_policy::AuthorizationPolicy;
pub use common::{Duration, Labels, Port, Protocol, StringMatch};
pub use destination_rule::DestinationRule;
pub use gateway::Gateway;
pub use peer_authentication::PeerAuthentication;
pub use request_authentication::RequestAuthentication;
pub use service_entry::ServiceEntry;
pub use sidecar::Sidecar;
pub use virtual_service::VirtualService;
pub use workload_entry::WorkloadEntry;
