//! The deployment artefacts under `deploy/` as the deploy tests read them: the kustomize builds'
//! documents parsed into their k8s-openapi types (refusing fields the types do not know), views
//! over the workloads, RBAC and the Istio CRDs, meshpilot command lines, and the Envoy
//! bootstraps.

/// The Envoy bootstraps and the load balancers' hashing.
pub mod bootstraps;
/// meshpilot command lines.
pub mod cli;
/// What the Kubernetes source reads and writes: the Istio CRDs, RBAC grants.
pub mod kube;
/// Workloads, selectors and ConfigMaps.
pub mod workloads;

use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
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

/// `deploy/kustomize/components/config-dir`: the optional config directory.
pub fn config_dir_component() -> PathBuf {
    repo().join("deploy/kustomize/components/config-dir")
}

/// `deploy/kustomize/overlays/config-dir`: the base with that component.
pub fn config_dir_overlay() -> PathBuf {
    repo().join("deploy/kustomize/overlays/config-dir")
}

/// Every kustomization directory under `deploy/kustomize`.
pub fn kustomize_dirs() -> Vec<PathBuf> {
    vec![base_dir(), config_dir_component(), config_dir_overlay()]
}

/// `deploy/crds/istio-crds.yaml`.
pub fn istio_crds_file() -> PathBuf {
    repo().join("deploy/crds/istio-crds.yaml")
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

/// The parts of kustomization.yaml (a Kustomization or a Component) this deployment uses;
/// anything else is refused (typos).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Kustomization {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// The namespace every object goes to.
    pub namespace: Option<String>,
    /// Manifest files and kustomization directories.
    #[serde(default)]
    pub resources: Vec<String>,
    /// Component directories.
    #[serde(default)]
    pub components: Vec<String>,
    /// Image rewrites.
    #[serde(default)]
    pub images: Vec<Image>,
    /// Generated ConfigMaps.
    #[serde(default)]
    pub config_map_generator: Vec<ConfigMapGenerator>,
    /// Patches.
    #[serde(default)]
    pub patches: Vec<Patch>,
}

/// A `patches` entry: a JSON patch file applied to the objects `target` names.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patch {
    /// The patch file, relative to the kustomization.
    pub path: String,
    /// What it patches.
    pub target: PatchTarget,
}

/// A patch's `target`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PatchTarget {
    /// API group (`""` or absent: core).
    #[serde(default)]
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Object name.
    pub name: String,
}

impl PatchTarget {
    /// Whether `doc` is the target.
    fn matches(&self, doc: &Value) -> bool {
        let api_version =
            if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) };
        doc["apiVersion"] == api_version.as_str()
            && doc["kind"] == self.kind.as_str()
            && doc["metadata"]["name"] == self.name.as_str()
    }
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
    /// The directory of its kustomization (its files are relative to it); set when loaded.
    #[serde(skip)]
    pub dir: PathBuf,
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

    /// The file of key `key`.
    pub fn file(&self, key: &str) -> Option<PathBuf> {
        self.entries().find(|(k, _)| k == key).map(|(_, file)| self.dir.join(file))
    }
}

/// `dir/kustomization.yaml`, parsed.
pub fn kustomization_in(dir: &Path) -> Kustomization {
    let path = dir.join("kustomization.yaml");
    let mut k: Kustomization = serde_saphyr::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", shown(&path)));
    for generator in &mut k.config_map_generator {
        generator.dir = dir.to_path_buf();
    }
    k
}

/// `deploy/kustomize/base/kustomization.yaml`, parsed.
pub fn kustomization() -> Kustomization {
    kustomization_in(&base_dir())
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
    /// A ValidatingWebhookConfiguration.
    ValidatingWebhook(ValidatingWebhookConfiguration),
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

/// A kustomize build as the tests see it: the parsed resources, generators and namespace.
pub struct Build {
    /// The kustomization directory, relative to the repository.
    pub name: String,
    /// The namespace everything goes to.
    pub namespace: String,
    /// Every ConfigMap generator, the components' included.
    pub generators: Vec<ConfigMapGenerator>,
    /// Every document that parsed (patched as kustomize would).
    pub manifests: Vec<Manifest>,
    /// Why the others did not, and patches that did not apply.
    pub parse_problems: Vec<String>,
}

impl Build {
    /// The generator of ConfigMap `name`.
    pub fn generator(&self, name: &str) -> Option<&ConfigMapGenerator> {
        self.generators.iter().find(|g| g.name == name)
    }
}

/// Builds the kustomize base.
pub fn load_base() -> Build {
    build(&base_dir())
}

/// Every way the deployment is shipped: the base, and the base with a config directory.
pub fn builds() -> Vec<Build> {
    vec![load_base(), build(&config_dir_overlay())]
}

/// Builds the kustomization in `dir` as kustomize would for what this deployment uses: its
/// resources (files, or kustomization directories built in turn), then each component's
/// generators and JSON patches, then its own; each document parsed into its type.
pub fn build(dir: &Path) -> Build {
    let mut raw = Raw::default();
    let namespace = raw_build(dir, &mut raw).unwrap_or_default();
    let mut manifests = Vec::new();
    for (file, doc, value) in raw.docs {
        match parse_object(&value) {
            Ok(object) => manifests.push(Manifest { file, doc, object }),
            Err(e) => raw.problems.push(format!("{file} document {doc}: {e}")),
        }
    }
    Build { name: shown(dir), namespace, generators: raw.generators, manifests, parse_problems: raw.problems }
}

/// A build before its documents are typed.
#[derive(Default)]
struct Raw {
    /// (file, 1-based document index, document).
    docs: Vec<(String, usize, Value)>,
    generators: Vec<ConfigMapGenerator>,
    problems: Vec<String>,
}

/// Adds what `dir`'s kustomization produces to `raw`; returns its namespace (or the one of
/// the first resource directory that sets one).
fn raw_build(dir: &Path, raw: &mut Raw) -> Option<String> {
    let k = kustomization_in(dir);
    let mut namespace = k.namespace.clone();
    for resource in &k.resources {
        let path = dir.join(resource);
        if path.is_dir() {
            let inner = raw_build(&path, raw);
            namespace = namespace.or(inner);
        } else if path.is_file() {
            raw.docs.extend(yaml_documents(&path).into_iter().map(|(doc, value)| (shown(&path), doc, value)));
        } // else: reported by the kustomization test
    }
    for component in &k.components {
        let component = dir.join(component);
        let c = kustomization_in(&component);
        apply_kustomization_parts(&component, c, raw);
    }
    apply_kustomization_parts(dir, k, raw);
    namespace
}

/// A kustomization's own generators and patches.
fn apply_kustomization_parts(dir: &Path, k: Kustomization, raw: &mut Raw) {
    raw.generators.extend(k.config_map_generator);
    for patch in &k.patches {
        let path = dir.join(&patch.path);
        let at = shown(&path);
        let ops: Vec<JsonPatchOp> = serde_saphyr::from_str(&read(&path))
            .unwrap_or_else(|e| panic!("{at}: not a JSON patch (a list of `add` operations): {e}"));
        let mut targets = raw.docs.iter_mut().filter(|(_, _, doc)| patch.target.matches(doc)).peekable();
        if targets.peek().is_none() {
            raw.problems.push(format!("{at}: its target {:?} matches no object", patch.target));
        }
        for (_, _, doc) in targets {
            for op in &ops {
                if let Err(e) = op.apply(doc) {
                    raw.problems.push(format!("{at}: {} {}: {e}", op.op, op.path));
                }
            }
        }
    }
}

/// One operation of an RFC 6902 JSON patch; only `add`, the one the deployment uses.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonPatchOp {
    op: String,
    path: String,
    value: Value,
}

impl JsonPatchOp {
    /// Applies the operation to `doc`. `add` sets an object member (creating it), or inserts into
    /// an array at an index or at its end (`-`); the parent must exist.
    fn apply(&self, doc: &mut Value) -> Result<(), String> {
        if self.op != "add" {
            return Err("only `add` is supported by this test".into());
        }
        let tokens: Vec<String> =
            self.path.split('/').skip(1).map(|t| t.replace("~1", "/").replace("~0", "~")).collect();
        let Some((last, parents)) = tokens.split_last() else { return Err("empty path".into()) };
        let mut at = doc;
        for token in parents {
            at = match at {
                Value::Object(map) => map.get_mut(token),
                Value::Array(items) => token.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
                _ => None,
            }
            .ok_or_else(|| format!("{token}: no such member"))?;
        }
        match at {
            Value::Object(map) => {
                map.insert(last.clone(), self.value.clone());
            }
            Value::Array(items) if last == "-" => items.push(self.value.clone()),
            Value::Array(items) => match last.parse::<usize>() {
                Ok(i) if i <= items.len() => items.insert(i, self.value.clone()),
                _ => return Err(format!("{last}: not an index of the array")),
            },
            _ => return Err("the parent is neither an object nor an array".into()),
        }
        Ok(())
    }
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
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => Object::ValidatingWebhook(typed(doc)?),
        _ => return Err(format!("apiVersion {api_version:?} kind {kind:?} is not one this test knows")),
    })
}

/// `doc` as a `T`, refusing keys `T` drops: the typed value, serialized back, must keep every
/// key of the input.
pub fn typed<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
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
