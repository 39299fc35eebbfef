//! The per-view part of the table's `Routing` row: which config objects a proxy view's resources
//! are generated from. A change made only of
//! objects a view does not depend on (before or after it) leaves every resource of that view as
//! it was, so the cache keeps them instead of generating them again: a VirtualService edit costs
//! the views that import it, not the whole mesh (Istio's `SidecarScope.DependsOnConfig`).

use std::collections::BTreeSet;

use crate::config::api::VirtualService;
use crate::config::{ConfigKey, Kind};
use crate::envoy::scope::{destination_hosts, Scope};
use crate::envoy::{ProxyKind, ProxyView, TypeUrl};
use crate::registry::host_matches;
use crate::snapshot::{Indexed, Snapshot};

/// One changed VirtualService or DestinationRule, with whether a sidecar reading it sees the
/// change in its routes only: decided once per change, not once per view.
#[derive(Debug)]
pub struct RoutingEdit {
    key: ConfigKey,
    routes_only: bool,
}

impl RoutingEdit {
    /// The change of the object `key` from `previous` to `next`.
    pub fn new(previous: &Snapshot, next: &Snapshot, key: ConfigKey) -> Self {
        let routes_only = changes_routes_only(previous, next, &key);
        RoutingEdit { key, routes_only }
    }

    /// The VirtualService edited, when a sidecar reading it sees the change in its routes only.
    pub fn routes_only(&self) -> Option<&ConfigKey> {
        self.routes_only.then_some(&self.key)
    }
}

/// The resource types of `view` that the `edits` (from `previous` to `next`) may alter, in push
/// order; none when the view reads none of the edited objects.
pub fn changed_types(previous: &Snapshot, next: &Snapshot, view: &ProxyView, edits: &[RoutingEdit]) -> Vec<TypeUrl> {
    let mut changed = BTreeSet::new();
    for RoutingEdit { key, routes_only } in edits {
        if !depends_on(previous, view, key) && !depends_on(next, view, key) {
            continue;
        }
        if view.kind == ProxyKind::Sidecar && *routes_only {
            changed.insert(TypeUrl::Route);
        } else {
            return TypeUrl::PUSH_ORDER.to_vec();
        }
    }
    TypeUrl::PUSH_ORDER.into_iter().filter(|t| changed.contains(t)).collect()
}

/// Whether a sidecar reads the change of VirtualService `key` in its routes only: the same hosts,
/// gateways and visibility (so the same proxies import it), HTTP rules only (listeners read TCP
/// and TLS rules), and the same destinations (which add clusters to a Sidecar's scope).
fn changes_routes_only(previous: &Snapshot, next: &Snapshot, key: &ConfigKey) -> bool {
    let (Some(a), Some(b)) = (previous.virtual_service(key), next.virtual_service(key)) else {
        return false;
    };
    let http_only = |vs: &VirtualService| vs.tcp.is_empty() && vs.tls.is_empty();
    let destinations = |vs: &VirtualService, s: &Snapshot| -> BTreeSet<_> {
        destination_hosts(vs, &key.namespace, &s.mesh.domain).into_iter().collect()
    };
    a.hosts == b.hosts
        && a.gateways == b.gateways
        && a.export_to == b.export_to
        && http_only(a)
        && http_only(b)
        && previous.mesh.domain == next.mesh.domain
        && destinations(a, previous) == destinations(b, next)
}

/// Whether `view`'s resources in `snapshot` may read the object `key` (true when unsure).
pub fn depends_on(snapshot: &Snapshot, view: &ProxyView, key: &ConfigKey) -> bool {
    // Gateways bind VirtualServices by gateway name and read rules for every server: not worth
    // narrowing, as there are few gateway views.
    if view.kind != ProxyKind::Sidecar {
        return true;
    }
    let view = &view.resolve(snapshot);
    match key.kind {
        // Sidecars read VirtualServices only through what their egress listeners import, and
        // delegates through the roots they import.
        Kind::VirtualService => {
            let scope = Scope::without_services(snapshot, view);
            let reads = |ix: &Indexed<VirtualService>| ix.config.key == *key || ix.delegates.contains(key);
            let imported = |imports| scope.mesh_virtual_services(imports).iter().any(|(ix, _)| reads(ix));
            scope.all_imports().into_iter().any(imported)
        }
        // Rules are read for the services the proxy has clusters (or routes) for and for its
        // inbound services; a rule whose hosts match none of them is read by nothing here.
        Kind::DestinationRule => {
            let Some(hosts) = snapshot.destination_rule_hosts(key) else {
                return false;
            };
            let matches = |host: &str| hosts.iter().any(|h| host_matches(h.as_str(), host));
            let scope = Scope::new(snapshot, view);
            scope.cluster_services().iter().any(|s| matches(s.hostname.as_str()))
                || view.inbound.iter().any(|p| matches(p.service.hostname.as_str()))
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::testing::{service_entry as service, sidecar, snapshot};

    fn key(kind: Kind, namespace: &str, name: &str) -> ConfigKey {
        ConfigKey { kind, namespace: namespace.into(), name: name.into() }
    }

    const SCOPED: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: a}
spec:
  egress:
  - hosts: ["./*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ex, namespace: a}
spec:
  hosts: [ex]
  http:
  - route: [{destination: {host: why.b.svc.cluster.local}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: why, namespace: b}
spec:
  hosts: [why]
  http:
  - route: [{destination: {host: why}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: why, namespace: b}
spec:
  host: why
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: zed, namespace: c}
spec:
  host: zed.c.svc.cluster.local
"#;

    #[test]
    fn a_scoped_sidecar_depends_only_on_what_it_imports() {
        let yaml = [service("ex", "a"), service("why", "b"), service("zed", "c")].concat();
        let s = snapshot(&format!("{yaml}{SCOPED}"));
        let scoped = sidecar("a", &[]);
        assert!(depends_on(&s, &scoped, &key(Kind::VirtualService, "a", "ex")));
        assert!(!depends_on(&s, &scoped, &key(Kind::VirtualService, "b", "why")), "b is not imported");
        // why is a destination of ex: its rule shapes a cluster of a.
        assert!(depends_on(&s, &scoped, &key(Kind::DestinationRule, "b", "why")));
        assert!(!depends_on(&s, &scoped, &key(Kind::DestinationRule, "c", "zed")));
        assert!(!depends_on(&s, &scoped, &key(Kind::DestinationRule, "c", "gone")), "not in this snapshot");
        // Without a Sidecar everything visible is imported.
        let open = sidecar("c", &[]);
        assert!(depends_on(&s, &open, &key(Kind::VirtualService, "b", "why")));
        assert!(depends_on(&s, &open, &key(Kind::DestinationRule, "c", "zed")));
        // Kinds it does not narrow count as read.
        assert!(depends_on(&s, &scoped, &key(Kind::Sidecar, "c", "default")));
    }

    #[test]
    fn an_http_edit_with_the_same_hosts_and_destinations_changes_routes_only() {
        let base = [service("ex", "a"), service("why", "b"), service("zed", "c")].concat();
        let vs = |http: &str, tcp: &str| {
            format!(
                "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: ex, namespace: a}}\n\
                 spec: {{hosts: [ex], http: [{http}], tcp: [{tcp}]}}\n"
            )
        };
        let at = |vs: String| snapshot(&format!("{base}{vs}"));
        let before = at(vs("{timeout: 1s, route: [{destination: {host: why.b.svc.cluster.local}}]}", ""));
        let view = sidecar("a", &[]);
        let changed = |after: &Snapshot| {
            let edits = [RoutingEdit::new(&before, after, key(Kind::VirtualService, "a", "ex"))];
            changed_types(&before, after, &view, &edits)
        };
        let retimed = at(vs("{timeout: 2s, route: [{destination: {host: why.b.svc.cluster.local}}]}", ""));
        assert_eq!(changed(&retimed), [TypeUrl::Route]);
        // Another destination is another cluster in a scoped view; TCP rules shape listeners.
        let elsewhere = at(vs("{route: [{destination: {host: zed.c.svc.cluster.local}}]}", ""));
        assert_eq!(changed(&elsewhere), TypeUrl::PUSH_ORDER);
        let tcp = at(vs(
            "{timeout: 1s, route: [{destination: {host: why.b.svc.cluster.local}}]}",
            "{route: [{destination: {host: why.b.svc.cluster.local}}]}",
        ));
        assert_eq!(changed(&tcp), TypeUrl::PUSH_ORDER);
        // A view that imports neither version changes not at all.
        let scoped = snapshot(&format!("{base}{SCOPED}"));
        let unrelated = [RoutingEdit::new(&scoped, &scoped, key(Kind::VirtualService, "b", "why"))];
        assert!(changed_types(&scoped, &scoped, &sidecar("a", &[]), &unrelated).is_empty());
    }
}
