//! The one owner of the Kubernetes source's state: what each watched object last became, which
//! kinds have listed, and what is wrong. It turns watch updates into `SourceEvent`s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tracing::{info, warn};

use super::kinds::Item;
use super::kinds::{Watched, SOURCE_NAME};
use super::watch::{Change, Failure, ObjectName, Update};
use crate::config::parse::Document;
use crate::config::{ConfigError, ConfigKey, FieldError, IgnoredObject, ValidConfig};
use crate::mesh::MeshConfig;
use crate::registry::intern::Interner;
use crate::registry::kubernetes::{KubeKey, KubeObject};
use crate::source::{SourceEvent, SourceId};

/// What a watched object last became.
#[derive(Debug)]
enum Held {
    /// A registry object, as last sent (its key is derived on deletion, not held twice).
    Kube(Arc<KubeObject>),
    /// An Istio object: its last valid version (still served while a newer one is invalid).
    Config(ConfigKey, ValidConfig),
    /// An object of a kind meshpilot does not serve, or one never valid.
    Other,
}

/// The events one update produces, in the order they must be sent.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Events for ingest.
    pub events: Vec<SourceEvent>,
}

/// The Kubernetes source's state.
#[derive(Debug)]
pub struct KubeState {
    held: BTreeMap<(Watched, ObjectName), Held>,
    /// Kinds that have not listed yet: nothing is complete before each has.
    pending: BTreeSet<Watched>,
    init_done: bool,
    /// Whether this source owns the mesh config (no mesh config file given).
    owns_mesh: bool,
    mesh: Option<Arc<MeshConfig>>,
    domain: String,
    failures: BTreeMap<Watched, Failure>,
    errors: BTreeMap<(Watched, ObjectName), ConfigError>,
    ignored: BTreeMap<(Watched, ObjectName), IgnoredObject>,
    status_dirty: bool,
    /// The values many registry objects repeat (a workload's pods' labels), held once.
    interner: Interner,
}

impl KubeState {
    /// A state waiting for `kinds` to list. With `owns_mesh`, the ConfigMap is one of them and the
    /// mesh config (stamped with `domain`) comes from it.
    pub fn new(kinds: impl IntoIterator<Item = Watched>, owns_mesh: bool, domain: String) -> KubeState {
        KubeState {
            held: BTreeMap::new(),
            pending: kinds.into_iter().collect(),
            init_done: false,
            owns_mesh,
            mesh: None,
            domain,
            failures: BTreeMap::new(),
            errors: BTreeMap::new(),
            ignored: BTreeMap::new(),
            status_dirty: true,
            interner: Interner::default(),
        }
    }

    /// Current problems by metric reason.
    pub fn problem_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut counts = BTreeMap::new();
        for failure in self.failures.values() {
            *counts.entry(failure.reason()).or_insert(0) += 1;
        }
        counts
    }

    /// Applies one update; returns the events to send.
    pub fn apply(&mut self, update: Update) -> Outcome {
        let watched = update.watched;
        let mut kube = Vec::new();
        let mut configs = Vec::new();
        let mut mesh = None;
        match update.change {
            Change::Relisted(items) => {
                self.clear_failure(watched);
                let listed: BTreeSet<&ObjectName> = items.iter().map(|(n, _)| n).collect();
                let gone: Vec<ObjectName> = self
                    .held
                    .range((watched, ObjectName::min())..)
                    .take_while(|((w, _), _)| *w == watched)
                    .filter(|((_, n), _)| !listed.contains(n))
                    .map(|((_, n), _)| n.clone())
                    .collect();
                for name in gone {
                    self.delete(watched, name, &mut kube, &mut configs);
                }
                if watched == Watched::MeshConfigMap && items.is_empty() {
                    mesh = self.set_mesh(Ok(MeshConfig::default()));
                }
                for (name, item) in items {
                    if let Some(m) = self.upsert(watched, name, item, &mut kube, &mut configs) {
                        mesh = Some(m);
                    }
                }
                if self.pending.remove(&watched) {
                    info!(kind = %watched, objects = self.count(watched), "kubernetes: listed");
                }
            }
            Change::Applied(name, item) => {
                self.clear_failure(watched);
                mesh = self.upsert(watched, name, item, &mut kube, &mut configs);
            }
            Change::Deleted(name) => {
                if watched == Watched::MeshConfigMap {
                    mesh = self.set_mesh(Ok(MeshConfig::default()));
                }
                self.delete(watched, name, &mut kube, &mut configs);
            }
            Change::Failed(failure) => {
                warn!(kind = %watched, error = %failure, "kubernetes: watch failing");
                // A kind this node may not read must not hold back the rest of the mesh, unless it
                // is a security policy: serving without the policies would widen access (fail
                // closed: readiness waits until RBAC lets it list them).
                let forbidden_policy = watched.is_security_policy() && matches!(failure, Failure::Forbidden(_));
                if failure.is_permanent() && !forbidden_policy && self.pending.remove(&watched) {
                    warn!(kind = %watched, "kubernetes: serving without this kind until it can be listed");
                    if watched == Watched::MeshConfigMap {
                        mesh = self.set_mesh(Ok(MeshConfig::default()));
                    }
                }
                if self.failures.get(&watched) != Some(&failure) {
                    self.failures.insert(watched, failure);
                    self.status_dirty = true;
                }
            }
        }
        let mut out = Outcome::default();
        // The status first: ingest's leading edge waits for what follows a status.
        if self.status_dirty {
            self.status_dirty = false;
            out.events.push(self.status());
        }
        if let Some(m) = mesh {
            out.events.push(SourceEvent::Mesh(m));
        }
        if !configs.is_empty() {
            out.events.push(SourceEvent::Config(configs));
        }
        if !kube.is_empty() {
            out.events.push(SourceEvent::Kube(kube));
        }
        if !self.init_done && self.pending.is_empty() {
            self.init_done = true;
            if self.owns_mesh {
                out.events.push(SourceEvent::InitDone(SourceId::MeshConfig));
            }
            out.events.push(SourceEvent::InitDone(SourceId::Kubernetes));
            info!("kubernetes: every watched kind has listed");
        }
        out
    }

    fn count(&self, watched: Watched) -> usize {
        self.held.range((watched, ObjectName::min())..).take_while(|((w, _), _)| *w == watched).count()
    }

    fn clear_failure(&mut self, watched: Watched) {
        if self.failures.remove(&watched).is_some() {
            info!(kind = %watched, "kubernetes: watch recovered");
            self.status_dirty = true;
        }
    }

    fn set_mesh(&mut self, mesh: Result<MeshConfig, crate::mesh::MeshConfigError>) -> Option<Arc<MeshConfig>> {
        if !self.owns_mesh {
            return None;
        }
        let key = (Watched::MeshConfigMap, ObjectName { namespace: String::new(), name: "mesh".into() });
        match mesh {
            Ok(mut m) => {
                if self.errors.remove(&key).is_some() {
                    self.status_dirty = true;
                }
                m.domain = self.domain.clone();
                if self.mesh.as_deref() == Some(&m) {
                    return None;
                }
                let m = Arc::new(m);
                self.mesh = Some(m.clone());
                Some(m)
            }
            Err(e) => {
                warn!(error = %e, "kubernetes: invalid mesh config; the previous one stays in force");
                let error = ConfigError {
                    file: SOURCE_NAME.into(),
                    document: 0,
                    object: None,
                    error: FieldError::new("", e.to_string()),
                    policy_selector: None,
                };
                self.errors.insert(key, error);
                self.status_dirty = true;
                // Before any valid mesh config, the defaults apply (as with an empty file).
                if self.mesh.is_none() {
                    return self.set_mesh(Ok(MeshConfig::default()));
                }
                None
            }
        }
    }

    fn upsert(
        &mut self,
        watched: Watched,
        name: ObjectName,
        item: Item,
        kube: &mut Vec<(KubeKey, Option<Arc<KubeObject>>)>,
        configs: &mut Vec<(ConfigKey, Option<ValidConfig>)>,
    ) -> Option<Arc<MeshConfig>> {
        let slot = (watched, name);
        match item {
            Item::Mesh(mesh) => return self.set_mesh(*mesh),
            Item::Kube(obj) => {
                let key = obj.key();
                if let Some(Held::Kube(old)) = self.held.get(&slot) {
                    if **old == obj {
                        return None;
                    }
                }
                let obj = Arc::new(self.interner.object(obj));
                kube.push((key, Some(obj.clone())));
                self.held.insert(slot, Held::Kube(obj));
            }
            Item::Config(Document::Valid(obj)) => {
                let key = obj.key.clone();
                self.clear_object_status(&slot);
                if let Some(Held::Config(_, old)) = self.held.get(&slot) {
                    if **old == obj {
                        return None;
                    }
                }
                let obj: ValidConfig = Arc::new(obj);
                configs.push((key.clone(), Some(obj.clone())));
                self.held.insert(slot, Held::Config(key, obj));
            }
            Item::Config(Document::Invalid(error)) => {
                warn!(
                    object = ?error.object.as_ref().map(ToString::to_string),
                    field = %error.error.field,
                    reason = %error.error.reason,
                    "kubernetes: invalid object skipped; its last valid version stays in force"
                );
                self.ignored.remove(&slot);
                self.errors.insert(slot.clone(), error);
                self.status_dirty = true;
                self.held.entry(slot).or_insert(Held::Other);
            }
            Item::Config(Document::Ignored { api_version, kind, name, .. }) => {
                self.errors.remove(&slot);
                let ignored = IgnoredObject { file: SOURCE_NAME.into(), document: 0, api_version, kind, name };
                if self.ignored.get(&slot) != Some(&ignored) {
                    self.ignored.insert(slot.clone(), ignored);
                    self.status_dirty = true;
                }
                self.held.insert(slot, Held::Other);
            }
        }
        None
    }

    fn clear_object_status(&mut self, slot: &(Watched, ObjectName)) {
        if self.errors.remove(slot).is_some() | self.ignored.remove(slot).is_some() {
            self.status_dirty = true;
        }
    }

    fn delete(
        &mut self,
        watched: Watched,
        name: ObjectName,
        kube: &mut Vec<(KubeKey, Option<Arc<KubeObject>>)>,
        configs: &mut Vec<(ConfigKey, Option<ValidConfig>)>,
    ) {
        let slot = (watched, name);
        self.clear_object_status(&slot);
        match self.held.remove(&slot) {
            Some(Held::Kube(obj)) => kube.push((obj.key(), None)),
            Some(Held::Config(key, _)) => configs.push((key, None)),
            Some(Held::Other) | None => {}
        }
    }

    fn status(&self) -> SourceEvent {
        let failures = self.failures.iter().map(|(watched, failure)| ConfigError {
            file: SOURCE_NAME.into(),
            document: 0,
            object: None,
            error: FieldError::new("", format!("{watched}: {failure}")),
            policy_selector: None,
        });
        let errors: Vec<ConfigError> = failures.chain(self.errors.values().cloned()).collect();
        SourceEvent::Status {
            source: SourceId::Kubernetes,
            errors: Arc::new(errors),
            ignored: Arc::new(self.ignored.values().cloned().collect()),
        }
    }
}

impl ObjectName {
    /// The smallest name: the start of a kind's range.
    fn min() -> ObjectName {
        ObjectName { namespace: String::new(), name: String::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::parse_object;
    use crate::registry::kubernetes::{KubeKind, KubeNamespace};
    use serde_json::json;

    const NS: Watched = Watched::Registry(KubeKind::Namespace);
    const VS: Watched =
        Watched::Istio(super::super::kinds::IstioKind { group: "networking.istio.io", kind: "VirtualService" });

    fn name(ns: &str, n: &str) -> ObjectName {
        ObjectName { namespace: ns.into(), name: n.into() }
    }

    fn namespace(n: &str) -> (ObjectName, Item) {
        (name("", n), Item::Kube(KubeObject::Namespace(KubeNamespace { name: n.into(), labels: Default::default() })))
    }

    fn vs(weight: i64) -> Item {
        Item::Config(parse_object(
            SOURCE_NAME,
            json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "r", "namespace": "shop"},
                   "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}, "weight": weight}]}]}}),
        ))
    }

    fn update(watched: Watched, change: Change) -> Update {
        Update { watched, change }
    }

    fn kube_changes(out: &Outcome) -> Vec<(String, bool)> {
        out.events
            .iter()
            .flat_map(|e| match e {
                SourceEvent::Kube(v) => v.iter().map(|(k, o)| (k.name.clone(), o.is_some())).collect(),
                _ => Vec::new(),
            })
            .collect()
    }

    fn init_done(out: &Outcome) -> bool {
        out.events.iter().any(|e| matches!(e, SourceEvent::InitDone(SourceId::Kubernetes)))
    }

    fn errors(out: &Outcome) -> Option<Vec<String>> {
        out.events.iter().rev().find_map(|e| match e {
            SourceEvent::Status { errors, .. } => Some(errors.iter().map(ToString::to_string).collect()),
            _ => None,
        })
    }

    #[test]
    fn init_done_waits_for_every_kind_and_a_relist_deletes_what_is_gone() {
        let mut s = KubeState::new([NS, VS], false, "cluster.local".into());
        let out = s.apply(update(NS, Change::Relisted(vec![namespace("a"), namespace("b")])));
        assert_eq!(kube_changes(&out), [("a".into(), true), ("b".into(), true)]);
        assert!(!init_done(&out), "VirtualServices have not listed yet");
        let out = s.apply(update(VS, Change::Relisted(vec![])));
        assert!(init_done(&out));

        // A relist after a 410 Gone or a dropped watch: `a` vanished meanwhile, `b` is unchanged
        // (nothing sent for it), `c` is new.
        let out = s.apply(update(NS, Change::Relisted(vec![namespace("b"), namespace("c")])));
        assert_eq!(kube_changes(&out), [("a".into(), false), ("c".into(), true)]);
        assert!(!init_done(&out), "InitDone is sent once");
    }

    #[test]
    fn an_invalid_update_keeps_the_last_valid_version_and_is_reported() {
        let mut s = KubeState::new([VS], false, "cluster.local".into());
        let out = s.apply(update(VS, Change::Relisted(vec![(name("shop", "r"), vs(100))])));
        assert!(out.events.iter().any(|e| matches!(e, SourceEvent::Config(c) if c[0].1.is_some())));
        let out = s.apply(update(VS, Change::Applied(name("shop", "r"), vs(-1))));
        assert!(!out.events.iter().any(|e| matches!(e, SourceEvent::Config(_))), "nothing replaces or deletes it");
        let errs = errors(&out).unwrap_or_default();
        assert!(errs.iter().any(|e| e.contains("VirtualService shop/r") && e.contains("weight")), "{errs:?}");
        // Fixed: served, and the error is gone.
        let out = s.apply(update(VS, Change::Applied(name("shop", "r"), vs(50))));
        assert!(out.events.iter().any(|e| matches!(e, SourceEvent::Config(_))));
        assert_eq!(errors(&out), Some(vec![]));
        // Deleted: a deletion is sent.
        let out = s.apply(update(VS, Change::Deleted(name("shop", "r"))));
        assert!(out.events.iter().any(|e| matches!(e, SourceEvent::Config(c) if c[0].1.is_none())));
    }

    #[test]
    fn a_forbidden_kind_counts_as_listed_and_an_unreachable_server_does_not() {
        let mut s = KubeState::new([NS, VS], false, "cluster.local".into());
        let out = s.apply(update(NS, Change::Failed(Failure::Unreachable("connection refused".into()))));
        assert!(!init_done(&out));
        let out = s.apply(update(VS, Change::Failed(Failure::Forbidden("403".into()))));
        assert!(!init_done(&out), "namespaces still pending");
        let errs = errors(&out).unwrap_or_default();
        assert!(errs.iter().any(|e| e.contains("VirtualService") && e.contains("forbidden")), "{errs:?}");
        assert_eq!(s.problem_counts(), BTreeMap::from([("forbidden", 1), ("unreachable", 1)]));
        let out = s.apply(update(NS, Change::Relisted(vec![namespace("a")])));
        assert!(init_done(&out));
        assert_eq!(s.problem_counts(), BTreeMap::from([("forbidden", 1)]));
    }

    #[test]
    fn a_forbidden_security_policy_kind_holds_readiness() {
        let ap = Watched::Istio(super::super::kinds::IstioKind {
            group: super::super::kinds::SECURITY,
            kind: "AuthorizationPolicy",
        });
        let mut s = KubeState::new([NS, ap], false, "cluster.local".into());
        let out = s.apply(update(NS, Change::Relisted(vec![namespace("a")])));
        assert!(!init_done(&out));
        let out = s.apply(update(ap, Change::Failed(Failure::Forbidden("403".into()))));
        assert!(!init_done(&out), "serving without AuthorizationPolicies would be fail-open");
        let out = s.apply(update(ap, Change::Relisted(vec![])));
        assert!(init_done(&out));
    }

    #[test]
    fn mesh_config_map_owns_the_mesh_and_its_init() {
        let mut s = KubeState::new([Watched::MeshConfigMap], true, "corp.internal".into());
        let out = s.apply(update(Watched::MeshConfigMap, Change::Relisted(vec![])));
        let mesh = out.events.iter().find_map(|e| match e {
            SourceEvent::Mesh(m) => Some(m.clone()),
            _ => None,
        });
        assert_eq!(mesh.map(|m| m.domain.clone()).as_deref(), Some("corp.internal"), "defaults without the ConfigMap");
        assert!(out.events.iter().any(|e| matches!(e, SourceEvent::InitDone(SourceId::MeshConfig))));
        let bad = Item::Mesh(Box::new(MeshConfig::parse("cm", "connectTimeout: -1s\n")));
        let out = s.apply(update(Watched::MeshConfigMap, Change::Applied(name("istio-system", "istio"), bad)));
        assert!(!out.events.iter().any(|e| matches!(e, SourceEvent::Mesh(_))), "an invalid mesh config is not applied");
        assert!(errors(&out).unwrap_or_default().iter().any(|e| e.contains("connectTimeout")));
    }
}
