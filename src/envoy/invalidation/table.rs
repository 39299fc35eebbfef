//! The table itself: one row per kind of changed key.

use crate::config::Kind;
use crate::registry::kubernetes::KubeKind;
use crate::registry::Hostname;
use crate::snapshot::{ChangeSet, ChangedKey};

/// What the change of one key can alter in the generated config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Alters<'a> {
    /// Only through the connected proxy's own view: a Pod's labels are its proxy's view, which
    /// keys the cache entries (its endpoints arrive as the hosts' endpoint changes).
    OwnView,
    /// The endpoints of this host: EDS (Istio's endpoint push), and CDS when one of the host's
    /// clusters embeds its endpoints (DNS resolution) or checks their identities (mutual TLS SANs);
    /// only for the views with clusters of the host ([`super::endpoints::has_clusters_of`]).
    EndpointsOf(&'a Hostname),
    /// What the views reading the edited VirtualService or DestinationRule generate, narrowed
    /// per view by [`super::routing::changed_types`].
    Routing,
    /// Every type of every view.
    Everything,
}

/// What the change of one key does to the resolution of views (`ProxyView::resolve`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolves<'a> {
    /// Every view keeps its resolution.
    Keeps,
    /// The views at an address where this host had or has an endpoint resolve again.
    At(&'a Hostname),
    /// Every view resolves again.
    Everything,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row<'a> {
    /// What it alters in the generated config.
    pub alters: Alters<'a>,
    /// What it does to views' resolutions.
    pub resolves: Resolves<'a>,
    /// Whether it can change a connected proxy's identity (labels, service account), which the
    /// registry's Pod gives.
    pub identity: bool,
}

/// The table: what a change of `key` can alter.
pub fn row(key: &ChangedKey) -> Row<'_> {
    let row = |alters, resolves| Row { alters, resolves, identity: false };
    match key {
        ChangedKey::Endpoints(host) => row(Alters::EndpointsOf(host), Resolves::At(host)),
        ChangedKey::Kube(k) if k.kind == KubeKind::Pod => {
            Row { alters: Alters::OwnView, resolves: Resolves::Keeps, identity: true }
        }
        // A credential is read by SDS and by the gateway listeners whose servers name it.
        ChangedKey::Kube(k) if k.kind == KubeKind::Secret => row(Alters::Everything, Resolves::Keeps),
        // Services, slices, nodes (locality), namespaces (network, discovery scope).
        ChangedKey::Kube(_) => row(Alters::Everything, Resolves::Everything),
        ChangedKey::Config(k) => match k.kind {
            Kind::VirtualService | Kind::DestinationRule => row(Alters::Routing, Resolves::Keeps),
            // Resolutions read Sidecars and the entries' services and workloads.
            Kind::Sidecar | Kind::ServiceEntry | Kind::WorkloadEntry => row(Alters::Everything, Resolves::Everything),
            // A selector reading another label key is caught as a whole, by
            // `Snapshot::reads_same_labels`.
            _ => row(Alters::Everything, Resolves::Keeps),
        },
        ChangedKey::Mesh => row(Alters::Everything, Resolves::Everything),
    }
}

/// Whether `changes` can change a connected proxy's identity (see [`Row::identity`]).
pub fn may_change_identities(changes: &ChangeSet) -> bool {
    changes.full || changes.keys.iter().any(|k| row(k).identity)
}
