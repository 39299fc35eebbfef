//! A snapshot's change set read through the table: what the generation cache carries over,
//! patches, or leaves to each view.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::routing::RoutingEdit;
use super::table::{row, Alters, Row};
use crate::envoy::TypeUrl;
use crate::registry::{Hostname, Registry, Resolution};
use crate::snapshot::{ChangedKey, Snapshot};

/// What a snapshot's change alters, read from the table once per snapshot (for the direct
/// successor of `previous`; anything else alters everything).
#[derive(Debug, Default)]
pub struct ChangeEffects {
    /// The types whose generations stay the previous snapshot's for every view.
    pub carried: Vec<TypeUrl>,
    /// With CDS carried (the same clusters): the hosts whose endpoints changed, the only ones
    /// whose EDS resources need generating again.
    pub endpoint_hosts: BTreeSet<Hostname>,
    /// A change made only of VirtualService and DestinationRule edits: each view regenerates
    /// what it reads of them.
    pub routing: Option<Arc<[RoutingEdit]>>,
}

impl ChangeEffects {
    /// The effects of `next`'s change set relative to `previous`.
    pub fn between(previous: &Snapshot, next: &Snapshot) -> ChangeEffects {
        let changes = &next.changes;
        if previous.version.next() != next.version || changes.full || changes.keys.is_empty() {
            return ChangeEffects::default();
        }
        let rows: Vec<(&ChangedKey, Row)> = changes.keys.iter().map(|k| (k, row(k))).collect();
        if rows.iter().all(|(_, r)| r.alters == Alters::Routing) {
            let edits = rows.iter().filter_map(|(key, _)| match key {
                ChangedKey::Config(key) => Some(RoutingEdit::new(previous, next, key.clone())),
                _ => None,
            });
            return ChangeEffects { routing: Some(edits.collect()), ..ChangeEffects::default() };
        }
        let mut hosts = BTreeSet::new();
        for (_, r) in rows {
            match r.alters {
                Alters::OwnView => {}
                Alters::EndpointsOf(host) => {
                    hosts.insert(host.clone());
                }
                Alters::Routing | Alters::Everything => return ChangeEffects::default(),
            }
        }
        let mut carried = vec![TypeUrl::Route, TypeUrl::Secret];
        // A headless service's non-HTTP ports listen on its endpoints' addresses.
        if !hosts.iter().any(|host| {
            listeners_read_endpoints(&previous.registry, host) || listeners_read_endpoints(&next.registry, host)
        }) {
            carried.insert(0, TypeUrl::Listener);
        }
        if hosts.iter().all(|host| clusters_ignore_endpoints(&previous.registry, &next.registry, host)) {
            carried.insert(0, TypeUrl::Cluster);
            return ChangeEffects { carried, endpoint_hosts: hosts, routing: None };
        }
        ChangeEffects { carried, endpoint_hosts: BTreeSet::new(), routing: None }
    }
}

/// Whether a service of `host` is headless with a non-HTTP port, which sidecars get a listener
/// for on each endpoint's address (see `outbound_plan`).
fn listeners_read_endpoints(registry: &Registry, host: &Hostname) -> bool {
    registry.services_of(host).any(|(_, s)| s.is_headless() && s.ports.iter().any(|p| !p.protocol.is_http()))
}

/// Whether the clusters of `host` are the same in both registries whatever its endpoints: none
/// resolves by DNS, and its endpoints' service accounts are the same.
fn clusters_ignore_endpoints(previous: &Registry, next: &Registry, host: &Hostname) -> bool {
    let accounts = |registry: &Registry, key| -> BTreeSet<Arc<str>> {
        let endpoints = registry.endpoints.get(key).map(|e| e.as_slice()).unwrap_or_default();
        endpoints.iter().map(|e| e.service_account.clone()).collect()
    };
    next.services_of(host).chain(previous.services_of(host)).all(|(key, service)| {
        matches!(service.resolution, Resolution::Static | Resolution::Passthrough)
            && accounts(previous, key) == accounts(next, key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigKey, Kind};
    use crate::envoy::may_change_identities;
    use crate::envoy::testing::snapshot;
    use crate::registry::kubernetes::{KubeKey, KubeKind};
    use crate::snapshot::{ChangeSet, Version};

    const SERVICES: &str = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: s, namespace: ns}
spec: {hosts: [s.example.com], ports: [{number: 80, name: http}], resolution: STATIC, endpoints: [{address: ENDPOINT}]}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: d, namespace: ns}
spec: {hosts: [d.example.com], ports: [{number: 80, name: http}], resolution: DNS, endpoints: [{address: ENDPOINT}]}
";

    /// The effects of a change from `before` to `after` (the next version) naming `keys`.
    fn effects(before: &str, after: &str, keys: &[ChangedKey]) -> ChangeEffects {
        let mut previous = snapshot(before);
        previous.version = Version::new(1, 1);
        let mut next = snapshot(after);
        next.version = Version::new(1, 2);
        next.changes = ChangeSet { full: false, keys: keys.iter().cloned().collect() };
        ChangeEffects::between(&previous, &next)
    }

    fn endpoints(host: &str) -> ChangedKey {
        ChangedKey::Endpoints(Hostname::new(host))
    }

    fn config(kind: Kind) -> ChangedKey {
        ChangedKey::Config(ConfigKey { kind, namespace: "ns".into(), name: "x".into() })
    }

    fn pod() -> ChangedKey {
        ChangedKey::Kube(KubeKey { kind: KubeKind::Pod, namespace: "ns".into(), name: "p".into() })
    }

    #[test]
    fn endpoints_of_a_static_host_regenerate_only_its_endpoints() {
        let (before, after) = (SERVICES.replace("ENDPOINT", "10.0.0.1"), SERVICES.replace("ENDPOINT", "10.0.0.2"));
        let e = effects(&before, &after, &[endpoints("s.example.com"), pod()]);
        assert_eq!(e.carried, [TypeUrl::Cluster, TypeUrl::Listener, TypeUrl::Route, TypeUrl::Secret]);
        assert_eq!(e.endpoint_hosts.iter().map(Hostname::as_str).collect::<Vec<_>>(), ["s.example.com"]);
        assert!(e.routing.is_none());
        // A DNS host's clusters embed its endpoints: CDS is generated again too.
        let e = effects(&before, &after, &[endpoints("s.example.com"), endpoints("d.example.com")]);
        assert_eq!(e.carried, [TypeUrl::Listener, TypeUrl::Route, TypeUrl::Secret]);
        assert!(e.endpoint_hosts.is_empty());
    }

    #[test]
    fn endpoints_of_a_headless_host_regenerate_listeners_too() {
        let headless = "apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: h, namespace: ns}
spec: {hosts: [h.example.com], ports: [{number: 5432, name: tcp, protocol: TCP}], resolution: NONE, workloadSelector: {labels: {app: h}}}
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: h, namespace: ns}
spec: {address: ENDPOINT, labels: {app: h}}
";
        let (before, after) = (headless.replace("ENDPOINT", "10.0.0.1"), headless.replace("ENDPOINT", "10.0.0.2"));
        let e = effects(&before, &after, &[endpoints("h.example.com")]);
        // Its sidecars listen on each endpoint's address.
        assert_eq!(e.carried, [TypeUrl::Cluster, TypeUrl::Route, TypeUrl::Secret]);
        assert_eq!(e.endpoint_hosts.len(), 1);
    }

    #[test]
    fn routing_edits_are_narrowed_per_view_and_anything_else_regenerates_everything() {
        let s = SERVICES.replace("ENDPOINT", "10.0.0.1");
        let e = effects(&s, &s, &[config(Kind::VirtualService), config(Kind::DestinationRule)]);
        assert_eq!(e.routing.as_deref().map(<[_]>::len), Some(2));
        assert!(e.carried.is_empty());
        for mixed in [
            vec![config(Kind::VirtualService), endpoints("s.example.com")],
            vec![config(Kind::Gateway)],
            vec![ChangedKey::Kube(KubeKey { kind: KubeKind::Secret, namespace: "ns".into(), name: "c".into() })],
            vec![ChangedKey::Mesh],
        ] {
            let e = effects(&s, &s, &mixed);
            assert!(e.carried.is_empty() && e.routing.is_none() && e.endpoint_hosts.is_empty(), "{mixed:?}");
        }
    }

    #[test]
    fn only_pods_and_full_changes_can_change_a_proxys_identity() {
        let changes = |keys: Vec<ChangedKey>| ChangeSet { full: false, keys: keys.into_iter().collect() };
        assert!(may_change_identities(&changes(vec![endpoints("s.example.com"), pod()])));
        assert!(!may_change_identities(&changes(vec![endpoints("s.example.com"), config(Kind::Sidecar)])));
        assert!(may_change_identities(&ChangeSet::full()));
    }
}
