//! The per-view part of the table's `EndpointsOf` row: which views an endpoint change reaches.

use std::collections::BTreeSet;

use crate::envoy::scope::Scope;
use crate::envoy::ProxyView;
use crate::registry::Hostname;
use crate::snapshot::Snapshot;

/// Whether `view` (resolved) has a cluster of any of `hosts` (EDS or not): a view with none
/// keeps every resource through an endpoint change of those hosts.
pub fn has_clusters_of(snapshot: &Snapshot, view: &ProxyView, hosts: &BTreeSet<Hostname>) -> bool {
    !Scope::without_services(snapshot, view).cluster_services_of(hosts).is_empty()
}
