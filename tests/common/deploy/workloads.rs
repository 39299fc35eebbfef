//! Views over the parsed kustomize base: workloads (Deployments and StatefulSets), selectors,
//! ConfigMaps and their keys.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{Build, Manifest, Object};

/// A Deployment or StatefulSet.
pub struct Workload<'a> {
    /// Where it is defined (`FILE document N`).
    pub at: String,
    /// `Deployment` or `StatefulSet`.
    pub kind: &'static str,
    /// `metadata.name`.
    pub name: &'a str,
    /// `spec.replicas`.
    pub replicas: Option<i32>,
    /// `spec.selector`.
    pub selector: &'a LabelSelector,
    /// `spec.template`.
    pub template: &'a PodTemplateSpec,
    /// Volume names from `volumeClaimTemplates`.
    pub claims: Vec<&'a str>,
}

impl Workload<'_> {
    /// The pod template's labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default()
    }

    /// The pod template's containers.
    pub fn containers(&self) -> &[Container] {
        self.template.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default()
    }

    /// The pod template's volumes.
    pub fn volumes(&self) -> &[Volume] {
        self.template.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default()
    }
}

/// The Deployments and StatefulSets among `manifests`.
pub fn workloads(manifests: &[Manifest]) -> Vec<Workload<'_>> {
    let mut out = Vec::new();
    for m in manifests {
        match &m.object {
            Object::Deployment(d) => {
                if let Some(spec) = &d.spec {
                    out.push(Workload {
                        at: m.at(),
                        kind: "Deployment",
                        name: d.metadata.name.as_deref().unwrap_or_default(),
                        replicas: spec.replicas,
                        selector: &spec.selector,
                        template: &spec.template,
                        claims: Vec::new(),
                    });
                }
            }
            Object::StatefulSet(s) => {
                if let Some(spec) = &s.spec {
                    let claims = spec
                        .volume_claim_templates
                        .iter()
                        .flatten()
                        .filter_map(|c| c.metadata.name.as_deref())
                        .collect();
                    out.push(Workload {
                        at: m.at(),
                        kind: "StatefulSet",
                        name: s.metadata.name.as_deref().unwrap_or_default(),
                        replicas: spec.replicas,
                        selector: &spec.selector,
                        template: &spec.template,
                        claims,
                    });
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether `selector` selects pods labelled `labels` (matchLabels only; expressions are refused).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<bool, String> {
    if selector.match_expressions.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err("matchExpressions are not supported by this test".into());
    }
    let wanted = selector.match_labels.clone().unwrap_or_default();
    if wanted.is_empty() {
        return Err("empty selector (selects everything)".into());
    }
    Ok(wanted.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// ConfigMap name → keys, from manifests and the kustomization's generators.
pub fn config_maps(base: &Build) -> BTreeMap<String, BTreeSet<String>> {
    let mut maps = BTreeMap::new();
    for generator in &base.generators {
        maps.insert(generator.name.clone(), generator.entries().map(|(key, _)| key).collect());
    }
    for m in &base.manifests {
        if let Object::ConfigMap(cm) = &m.object {
            let keys = cm.data.iter().flatten().map(|(k, _)| k.clone());
            let binary = cm.binary_data.iter().flatten().map(|(k, _)| k.clone());
            maps.insert(cm.metadata.name.clone().unwrap_or_default(), keys.chain(binary).collect());
        }
    }
    maps
}

/// The generator file of ConfigMap `name`, key `key`.
pub fn generated_file(build: &Build, name: &str, key: &str) -> PathBuf {
    let generator = build.generator(name).unwrap_or_else(|| panic!("{}: no configMapGenerator {name}", build.name));
    generator.file(key).unwrap_or_else(|| panic!("{}: configMapGenerator {name} has no key {key}", build.name))
}

/// (name, number) of each port a container declares.
pub fn container_ports(container: &Container) -> Vec<(Option<&str>, i32)> {
    container.ports.iter().flatten().map(|p| (p.name.as_deref(), p.container_port)).collect()
}

/// `$(NAME)` references in `s`.
pub fn var_refs(s: &str) -> Vec<&str> {
    let mut refs = Vec::new();
    let mut rest = s;
    while let Some(start) = rest.find("$(") {
        let after = &rest[start + 2..];
        match after.find(')') {
            Some(end) => {
                refs.push(&after[..end]);
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    refs
}
