//! PeerAuthentication resolution, as Istio's `ComposePeerAuthentication`: the mesh policy (root
//! namespace, no selector), overridden by the namespace policy, overridden by the workload
//! policy (a selector matching the workload, in its namespace), then per target port by the
//! workload policy's `portLevelMtls`. `UNSET` inherits; with nothing set the mode is PERMISSIVE.

use std::collections::BTreeMap;

use super::Snapshot;
use crate::config::api::peer_authentication::{MtlsMode, MutualTls};
use crate::config::api::{Labels, PeerAuthentication};
use crate::config::{Kind, Spec, ValidConfig};

/// The resolved mutual TLS modes of one workload (never `Unset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerMtls {
    /// The mode of ports without a port-level setting.
    pub mode: MtlsMode,
    /// Modes by target port.
    pub per_port: BTreeMap<u32, MtlsMode>,
}

impl PeerMtls {
    /// PERMISSIVE modes become DISABLE (for a proxy that cannot terminate mutual TLS).
    pub fn downgrade_permissive(&mut self) {
        let down = |m: &mut MtlsMode| {
            if *m == MtlsMode::Permissive {
                *m = MtlsMode::Disable;
            }
        };
        down(&mut self.mode);
        self.per_port.values_mut().for_each(down);
    }

    /// The mode a workload applies on target port `port`.
    pub fn mode_for_port(&self, port: u16) -> MtlsMode {
        self.per_port.get(&u32::from(port)).copied().unwrap_or(self.mode)
    }
}

impl Snapshot {
    /// PeerAuthentications, in key order.
    fn peer_authentications(&self) -> impl Iterator<Item = (&ValidConfig, &PeerAuthentication)> {
        self.configs_of(Kind::PeerAuthentication).filter_map(|c| match &c.spec {
            Spec::PeerAuthentication(pa) => Some((c, pa)),
            _ => None,
        })
    }

    /// The modes a workload in `namespace` with `labels` accepts. Istio picks the oldest policy
    /// of a level; meshpilot does not keep creation times, so the first by name stands in.
    pub fn peer_mtls_for(&self, namespace: &str, labels: &Labels) -> PeerMtls {
        let root = self.mesh.root_namespace.as_str();
        let mut mesh = None;
        let mut ns_level = None;
        let mut workload = None;
        for (c, pa) in self.peer_authentications() {
            let ns = c.key.namespace.as_str();
            match pa.selector_labels() {
                None if ns == root => {
                    mesh.get_or_insert(pa);
                }
                None if ns == namespace => {
                    ns_level.get_or_insert(pa);
                }
                Some(selector)
                    if ns == namespace && ns != root && selector.iter().all(|(k, v)| labels.get(k) == Some(v)) =>
                {
                    workload.get_or_insert(pa);
                }
                _ => {}
            }
        }
        let mut mode = MtlsMode::Permissive;
        for level in [mesh, ns_level, workload].into_iter().flatten() {
            if let Some(m) = MutualTls::set_mode(level.mtls.as_ref()) {
                mode = m;
            }
        }
        let per_port = workload
            .and_then(|w| w.port_level_mtls.as_ref())
            .map(|ports| ports.iter().map(|(p, m)| (*p, MutualTls::set_mode(Some(m)).unwrap_or(mode))).collect())
            .unwrap_or_default();
        PeerMtls { mode, per_port }
    }

    /// Istio's best-effort guess of what a service's workloads in `namespace` accept, from the
    /// mesh and namespace policies only (what auto mTLS reads on the client side).
    pub fn namespace_mtls_mode(&self, namespace: &str) -> MtlsMode {
        self.peer_mtls_for(namespace, &Labels::new()).mode
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::snapshot::{ChangeSet, SourceState, Version};

    fn snapshot(yaml: &str) -> Snapshot {
        let mut state = SourceState::default();
        for doc in parse_file("t.yaml", yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state)
    }

    fn pa(ns: &str, name: &str, spec: &str) -> String {
        format!("---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn permissive_without_policy() {
        let s = snapshot("");
        assert_eq!(
            s.peer_mtls_for("a", &Labels::new()),
            PeerMtls { mode: MtlsMode::Permissive, per_port: BTreeMap::new() }
        );
    }

    #[test]
    fn mesh_then_namespace_then_workload_then_port() {
        let yaml = [
            pa("istio-system", "mesh", "{mtls: {mode: STRICT}}"),
            pa("istio-system", "root-selector", "{selector: {matchLabels: {app: x}}, mtls: {mode: DISABLE}}"),
            pa("a", "ns", "{mtls: {mode: UNSET}}"),
            pa("b", "ns", "{mtls: {mode: PERMISSIVE}}"),
            pa("b", "wl", "{selector: {matchLabels: {app: x}}, portLevelMtls: {8080: {mode: DISABLE}, 9090: {}}}"),
        ]
        .concat();
        let s = snapshot(&yaml);
        let x = labels(&[("app", "x")]);
        // A root-namespace policy with a selector is no mesh policy and selects nothing elsewhere.
        assert_eq!(s.peer_mtls_for("a", &x).mode, MtlsMode::Strict, "namespace UNSET inherits the mesh's");
        assert_eq!(s.peer_mtls_for("c", &Labels::new()).mode, MtlsMode::Strict);
        let b = s.peer_mtls_for("b", &x);
        assert_eq!(b.mode, MtlsMode::Permissive, "workload UNSET inherits the namespace's");
        assert_eq!(b.mode_for_port(8080), MtlsMode::Disable);
        assert_eq!(b.mode_for_port(9090), MtlsMode::Permissive, "port UNSET inherits the workload's");
        assert_eq!(b.mode_for_port(80), MtlsMode::Permissive);
        assert_eq!(s.peer_mtls_for("b", &labels(&[("app", "y")])).per_port.len(), 0);
        assert_eq!(s.namespace_mtls_mode("b"), MtlsMode::Permissive);
    }

    #[test]
    fn the_first_policy_of_a_level_wins_and_the_root_namespace_follows_mesh_config() {
        let yaml =
            [pa("ns", "a-first", "{mtls: {mode: DISABLE}}"), pa("ns", "b-second", "{mtls: {mode: STRICT}}")].concat();
        assert_eq!(snapshot(&yaml).peer_mtls_for("ns", &Labels::new()).mode, MtlsMode::Disable);
        let mut state = SourceState::default();
        for doc in parse_file("t.yaml", &pa("mesh-root", "m", "{mtls: {mode: STRICT}}")) {
            let Document::Valid(o) = doc else { panic!() };
            state.configs.insert(o.key.clone(), Arc::new(o));
        }
        state.mesh = Arc::new(crate::mesh::MeshConfig { root_namespace: "mesh-root".into(), ..Default::default() });
        let s = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &state);
        assert_eq!(s.peer_mtls_for("any", &Labels::new()).mode, MtlsMode::Strict);
    }
}
