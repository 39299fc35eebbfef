//! The deployment artefacts under `deploy/` as the deploy tests read them: the kustomize base's
//! documents parsed into their k8s-openapi types (refusing fields the types do not know), views
//! over the workloads, meshpilot command lines, and the Envoy bootstraps.

/// The Envoy bootstraps and the load balancers' hashing.
pub mod bootstraps;
/// meshpilot command lines.
pub mod cli;
/// Workloads, selectors and ConfigMaps.
pub mod workloads;

use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The repository (the crate root).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `deploy/kustomize/base`.
pub fn base_dir() -> PathBuf {
    repo().join("deploy/kustomize/base")
}

/// `deploy/local`.
pub fn local_dir() -> PathBuf {
    repo().join("deploy/local")
}

/// `path` relative to the repository, for messages.
pub fn shown(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap_or(path).display().to_string()
}

/// The text of `path`; panics naming it.
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", shown(path)))
}

/// The YAML documents of `path` as JSON values, with their 1-based index; empty ones skipped.
pub fn yaml_documents(path: &Path) -> Vec<(usize, Value)> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read(path)).unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", shown(path)));
    docs.into_iter().enumerate().filter(|(_, d)| !d.is_null()).map(|(i, d)| (i + 1, d)).collect()
}

/// The single YAML document of `path` (an Envoy bootstrap).
pub fn yaml_value(path: &Path) -> Value {
    let mut docs = yaml_documents(path);
    assert_eq!(docs.len(), 1, "{}: expected exactly one YAML document", shown(path));
    let (_, doc) = docs.remove(0);
    assert!(doc.is_object(), "{}: expected a mapping", shown(path));
    doc
}

/// Panics listing `problems`, if any.
pub fn assert_no_problems(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}: {} problem(s):\n  {}", problems.len(), problems.join("\n  "));
}

/// The parts of kustomization.yaml this deployment uses; anything else is refused (typos).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Kustomization {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// The namespace every object goes to.
    pub namespace: String,
    /// The manifest files.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Image rewrites.
    #[serde(default)]
    pub images: Vec<Image>,
    /// Generated ConfigMaps.
    #[serde(default)]
    pub config_map_generator: Vec<ConfigMapGenerator>,
}

/// An `images` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Image {
    /// The image name containers use.
    pub name: String,
    /// What it becomes.
    pub new_name: Option<String>,
    /// Its tag.
    pub new_tag: Option<String>,
}

/// A `configMapGenerator` entry.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigMapGenerator {
    /// The ConfigMap's name.
    pub name: String,
    /// Its options.
    #[serde(default)]
    pub options: Option<GeneratorOptions>,
    /// `key=path` or `path` entries.
    #[serde(default)]
    pub files: Vec<String>,
}

/// A generator's `options`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GeneratorOptions {
    /// `true`: no content hash in the name.
    pub disable_name_suffix_hash: Option<bool>,
}

impl ConfigMapGenerator {
    /// Whether the generated name carries a content hash (a change then rolls the workloads).
    pub fn hashed(&self) -> bool {
        self.options.as_ref().and_then(|o| o.disable_name_suffix_hash) != Some(true)
    }

    /// (key, file) of each `files` entry: `key=path` or `path` (key = its file name).
    pub fn entries(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.files.iter().map(|entry| match entry.split_once('=') {
            Some((key, path)) => (key.to_string(), path.to_string()),
            None => (entry.rsplit('/').next().unwrap_or(entry).to_string(), entry.clone()),
        })
    }
}

/// `deploy/kustomize/base/kustomization.yaml`, parsed.
pub fn kustomization() -> Kustomization {
    let path = base_dir().join("kustomization.yaml");
    serde_saphyr::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", shown(&path)))
}

/// A Kubernetes object of the deployment, typed.
pub enum Object {
    /// A Namespace.
    Namespace(Namespace),
    /// A ServiceAccount.
    ServiceAccount(ServiceAccount),
    /// A ConfigMap.
    ConfigMap(ConfigMap),
    /// A Service.
    Service(Service),
    /// A Deployment.
    Deployment(Deployment),
    /// A StatefulSet.
    StatefulSet(StatefulSet),
    /// A HorizontalPodAutoscaler.
    Hpa(HorizontalPodAutoscaler),
    /// A PodDisruptionBudget.
    Pdb(PodDisruptionBudget),
    /// A Role.
    Role(Role),
    /// A RoleBinding.
    RoleBinding(RoleBinding),
    /// A ClusterRole.
    ClusterRole(ClusterRole),
    /// A ClusterRoleBinding.
    ClusterRoleBinding(ClusterRoleBinding),
}

/// One parsed document.
pub struct Manifest {
    /// Its file, relative to the repository.
    pub file: String,
    /// Its 1-based index in the file.
    pub doc: usize,
    /// The object.
    pub object: Object,
}

impl Manifest {
    /// `FILE document N`, for messages.
    pub fn at(&self) -> String {
        format!("{} document {}", self.file, self.doc)
    }
}

/// The kustomize base: its parsed resources, and the documents that failed to parse.
pub struct Base {
    /// kustomization.yaml.
    pub kustomization: Kustomization,
    /// Every document that parsed.
    pub manifests: Vec<Manifest>,
    /// Why the others did not.
    pub parse_problems: Vec<String>,
}

/// Loads every resource of the kustomize base.
pub fn load_base() -> Base {
    let kustomization = kustomization();
    let mut manifests = Vec::new();
    let mut parse_problems = Vec::new();
    for file in &kustomization.resources {
        let path = base_dir().join(file);
        if !path.is_file() {
            continue; // reported by the kustomization test
        }
        for (doc, value) in yaml_documents(&path) {
            match parse_object(&value) {
                Ok(object) => manifests.push(Manifest { file: shown(&path), doc, object }),
                Err(e) => parse_problems.push(format!("{} document {doc}: {e}", shown(&path))),
            }
        }
    }
    Base { kustomization, manifests, parse_problems }
}

/// Deserializes `doc` into the k8s-openapi type its apiVersion and kind name.
pub fn parse_object(doc: &Value) -> Result<Object, String> {
    let api_version = doc.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or_default();
    Ok(match (api_version, kind) {
        ("v1", "Namespace") => Object::Namespace(typed(doc)?),
        ("v1", "ServiceAccount") => Object::ServiceAccount(typed(doc)?),
        ("v1", "ConfigMap") => Object::ConfigMap(typed(doc)?),
        ("v1", "Service") => Object::Service(typed(doc)?),
        ("apps/v1", "Deployment") => Object::Deployment(typed(doc)?),
        ("apps/v1", "StatefulSet") => Object::StatefulSet(typed(doc)?),
        ("autoscaling/v2", "HorizontalPodAutoscaler") => Object::Hpa(typed(doc)?),
        ("policy/v1", "PodDisruptionBudget") => Object::Pdb(typed(doc)?),
        ("rbac.authorization.k8s.io/v1", "Role") => Object::Role(typed(doc)?),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => Object::RoleBinding(typed(doc)?),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => Object::ClusterRole(typed(doc)?),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => Object::ClusterRoleBinding(typed(doc)?),
        _ => return Err(format!("apiVersion {api_version:?} kind {kind:?} is not one this test knows")),
    })
}

/// `doc` as a `T`, refusing keys `T` drops: the typed value, serialized back, must keep every
/// key of the input.
fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let object: T = serde_path_to_error::deserialize(doc).map_err(|e| format!("at {}: {}", e.path(), e.inner()))?;
    let back = serde_json::to_value(&object).map_err(|e| format!("serializing back: {e}"))?;
    let mut dropped = Vec::new();
    dropped_keys(doc, &back, "", &mut dropped);
    if dropped.is_empty() {
        Ok(object)
    } else {
        Err(format!("unknown field(s) (a typo, a misplaced or a null field): {}", dropped.join(", ")))
    }
}

/// Paths of keys in `input` that `typed` lacks.
fn dropped_keys(input: &Value, typed: &Value, path: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(input), Value::Object(typed)) => {
            for (key, value) in input {
                let at = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                match typed.get(key) {
                    Some(kept) => dropped_keys(value, kept, &at, out),
                    None => out.push(at),
                }
            }
        }
        (Value::Array(input), Value::Array(typed)) => {
            for (i, (value, kept)) in input.iter().zip(typed).enumerate() {
                dropped_keys(value, kept, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}
