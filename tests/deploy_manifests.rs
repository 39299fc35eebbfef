//! The deployment artefacts under `deploy/` hold together:
//! - every document under `deploy/kustomize` parses into its k8s-openapi type, with no field the
//!   type does not know (k8s-openapi ignores unknown fields, so a typo would pass silently);
//! - references resolve: kustomization files, selectors, Service ports, mounted ConfigMaps and
//!   their keys, service accounts, RBAC, the HPA target;
//! - meshpilot containers (and `deploy/local/run-local.sh`) use only the CLI's flags;
//! - the Envoy bootstraps pass `envoy --mode validate`;
//! - the load balancers hash proxies as the frontends' ownership (Maglev) does: statically, and
//!   for Kubernetes end to end, with a real Envoy resolving a stub DNS name to several frontends.

mod common;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodTemplateSpec, Service, ServiceAccount, ServicePort, Volume,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use meshpilot::cluster::ownership::{Maglev, MaglevSettings, Ownership, ProxyHashing, PROXY_KEY_HEADER};
use meshpilot::config::parse::Document;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use support::{free_addr, free_port, http_client, http_request, Backend, Envoy, STARTUP_TIMEOUT};

/// Flags of `meshpilot ingest` the deployment may use.
const INGEST_FLAGS: &[&str] = &[
    "--etcd-endpoints",
    "--config-dir",
    "--mesh-config",
    "--snapshot-addr",
    "--advertise-addr",
    "--admin-addr",
    "--id",
    "--lease-ttl",
];
/// Flags of `meshpilot frontend` the deployment may use.
const FRONTEND_FLAGS: &[&str] =
    &["--etcd-endpoints", "--xds-addr", "--advertise-addr", "--admin-addr", "--id", "--proxy-key"];
const PROXY_KEYS: &[&str] = &["namespace-service-account", "node-id"];
/// The image name meshpilot containers use in the manifests (kustomize `images` rewrites it).
const MESHPILOT_IMAGE: &str = "meshpilot";

// ---------------------------------------------------------------------------------------------
// Loading

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn base_dir() -> PathBuf {
    repo().join("deploy/kustomize/base")
}

fn local_dir() -> PathBuf {
    repo().join("deploy/local")
}

/// `path` relative to the repository, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(repo()).unwrap_or(path).display().to_string()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", shown(path)))
}

/// The YAML documents of `path` as JSON values, with their 1-based index; empty ones skipped.
fn yaml_documents(path: &Path) -> Vec<(usize, Value)> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read(path)).unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", shown(path)));
    docs.into_iter().enumerate().filter(|(_, d)| !d.is_null()).map(|(i, d)| (i + 1, d)).collect()
}

/// The single YAML document of `path` (an Envoy bootstrap).
fn yaml_value(path: &Path) -> Value {
    let mut docs = yaml_documents(path);
    assert_eq!(docs.len(), 1, "{}: expected exactly one YAML document", shown(path));
    let (_, doc) = docs.remove(0);
    assert!(doc.is_object(), "{}: expected a mapping", shown(path));
    doc
}

fn assert_no_problems(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}: {} problem(s):\n  {}", problems.len(), problems.join("\n  "));
}

/// The parts of kustomization.yaml this deployment uses; anything else is refused (typos).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Kustomization {
    api_version: String,
    kind: String,
    namespace: String,
    #[serde(default)]
    resources: Vec<String>,
    #[serde(default)]
    images: Vec<Image>,
    #[serde(default)]
    config_map_generator: Vec<ConfigMapGenerator>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Image {
    name: String,
    new_name: Option<String>,
    new_tag: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigMapGenerator {
    name: String,
    #[serde(default)]
    options: Option<GeneratorOptions>,
    #[serde(default)]
    files: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GeneratorOptions {
    disable_name_suffix_hash: Option<bool>,
}

impl ConfigMapGenerator {
    /// Whether the generated name carries a content hash (a change then rolls the workloads).
    fn hashed(&self) -> bool {
        self.options.as_ref().and_then(|o| o.disable_name_suffix_hash) != Some(true)
    }

    /// (key, file) of each `files` entry: `key=path` or `path` (key = its file name).
    fn entries(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.files.iter().map(|entry| match entry.split_once('=') {
            Some((key, path)) => (key.to_string(), path.to_string()),
            None => (entry.rsplit('/').next().unwrap_or(entry).to_string(), entry.clone()),
        })
    }
}

fn kustomization() -> Kustomization {
    let path = base_dir().join("kustomization.yaml");
    serde_saphyr::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", shown(&path)))
}

/// A Kubernetes object of the deployment, typed.
enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ConfigMap(ConfigMap),
    Service(Service),
    Deployment(Deployment),
    StatefulSet(StatefulSet),
    Hpa(HorizontalPodAutoscaler),
    Pdb(PodDisruptionBudget),
    Role(Role),
    RoleBinding(RoleBinding),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
}

/// One parsed document.
struct Manifest {
    file: String,
    doc: usize,
    object: Object,
}

impl Manifest {
    fn at(&self) -> String {
        format!("{} document {}", self.file, self.doc)
    }
}

/// The kustomize base: its parsed resources, and the documents that failed to parse.
struct Base {
    kustomization: Kustomization,
    manifests: Vec<Manifest>,
    parse_problems: Vec<String>,
}

fn load_base() -> Base {
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
fn parse_object(doc: &Value) -> Result<Object, String> {
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

// ---------------------------------------------------------------------------------------------
// Views over the parsed objects

/// A Deployment or StatefulSet.
struct Workload<'a> {
    at: String,
    kind: &'static str,
    name: &'a str,
    replicas: Option<i32>,
    selector: &'a LabelSelector,
    template: &'a PodTemplateSpec,
    /// Volume names from `volumeClaimTemplates`.
    claims: Vec<&'a str>,
}

impl Workload<'_> {
    fn labels(&self) -> BTreeMap<String, String> {
        self.template.metadata.as_ref().and_then(|m| m.labels.clone()).unwrap_or_default()
    }

    fn containers(&self) -> &[Container] {
        self.template.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default()
    }

    fn volumes(&self) -> &[Volume] {
        self.template.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default()
    }
}

fn workloads(manifests: &[Manifest]) -> Vec<Workload<'_>> {
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
fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> Result<bool, String> {
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
fn config_maps(base: &Base) -> BTreeMap<String, BTreeSet<String>> {
    let mut maps = BTreeMap::new();
    for generator in &base.kustomization.config_map_generator {
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
fn generated_file(base: &Base, name: &str, key: &str) -> PathBuf {
    let generator = base
        .kustomization
        .config_map_generator
        .iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("kustomization.yaml: no configMapGenerator {name}"));
    let (_, file) = generator
        .entries()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("kustomization.yaml: configMapGenerator {name} has no key {key}"));
    base_dir().join(file)
}

fn container_ports(container: &Container) -> Vec<(Option<&str>, i32)> {
    container.ports.iter().flatten().map(|p| (p.name.as_deref(), p.container_port)).collect()
}

/// `$(NAME)` references in `s`.
fn var_refs(s: &str) -> Vec<&str> {
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

// ---------------------------------------------------------------------------------------------
// meshpilot command lines

/// A parsed `meshpilot ingest|frontend ...` command line.
#[derive(Debug)]
struct Cli {
    subcommand: String,
    flags: BTreeMap<String, String>,
}

/// Parses `args` (subcommand first; `--flag value` or `--flag=value`) against the CLI contract.
fn parse_cli(args: &[String]) -> Result<Cli, Vec<String>> {
    let Some((subcommand, rest)) = args.split_first() else {
        return Err(vec!["no arguments: the subcommand (ingest or frontend) is missing".into()]);
    };
    let allowed = match subcommand.as_str() {
        "ingest" => INGEST_FLAGS,
        "frontend" => FRONTEND_FLAGS,
        other => return Err(vec![format!("subcommand {other:?} is neither ingest nor frontend")]),
    };
    let mut problems = Vec::new();
    let mut flags = BTreeMap::new();
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        if !arg.starts_with("--") {
            problems.push(format!("unexpected argument {arg:?}"));
            continue;
        }
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
            None => {
                let value = rest.get(i).filter(|v| !v.starts_with("--")).cloned();
                if value.is_some() {
                    i += 1;
                }
                (arg.clone(), value)
            }
        };
        if !allowed.contains(&flag.as_str()) {
            problems.push(format!("`meshpilot {subcommand}` has no flag {flag}"));
        }
        let Some(value) = value else {
            problems.push(format!("{flag} has no value"));
            continue;
        };
        if flag == "--proxy-key" && !PROXY_KEYS.contains(&value.as_str()) {
            problems.push(format!("--proxy-key {value:?} is not one of {PROXY_KEYS:?}"));
        }
        if flags.insert(flag.clone(), value).is_some() {
            problems.push(format!("{flag} given twice"));
        }
    }
    let required: &[&str] =
        if subcommand == "ingest" { &["--etcd-endpoints", "--config-dir"] } else { &["--etcd-endpoints"] };
    for flag in required {
        if !flags.contains_key(*flag) {
            problems.push(format!("`meshpilot {subcommand}` needs {flag}"));
        }
    }
    if problems.is_empty() {
        Ok(Cli { subcommand: subcommand.clone(), flags })
    } else {
        Err(problems)
    }
}

fn is_meshpilot(container: &Container) -> bool {
    container.image.as_deref() == Some(MESHPILOT_IMAGE)
}

/// The meshpilot command lines of deploy/local/run-local.sh: `start NAME "$MESHPILOT" ARGS...`.
fn run_local_command_lines() -> Vec<(usize, Vec<String>)> {
    let script = read(&local_dir().join("run-local.sh"));
    script
        .lines()
        .enumerate()
        .filter_map(|(n, line)| {
            let (_, rest) = line.strip_prefix("start ")?.split_once("\"$MESHPILOT\" ")?;
            let args = rest.split_whitespace().map(|t| t.trim_matches('"').to_string()).collect();
            Some((n + 1, args))
        })
        .collect()
}

/// Port of a `HOST:PORT` flag value.
fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// Kubernetes manifests

#[test]
fn kustomization_lists_every_file_and_every_listed_file_exists() {
    let k = kustomization();
    let mut problems = Vec::new();
    if k.api_version != "kustomize.config.k8s.io/v1beta1" || k.kind != "Kustomization" {
        problems.push(format!("apiVersion/kind {}/{} is not a Kustomization", k.api_version, k.kind));
    }
    let mut listed = BTreeSet::new();
    let generated = k.config_map_generator.iter().flat_map(|g| g.entries().map(|(_, file)| file));
    for file in k.resources.iter().cloned().chain(generated) {
        if !base_dir().join(&file).is_file() {
            problems.push(format!("{file}: listed in kustomization.yaml but missing"));
        }
        if !listed.insert(file.clone()) {
            problems.push(format!("{file}: listed twice"));
        }
    }
    for file in files_under(&base_dir(), Path::new("")) {
        if file != "kustomization.yaml" && !listed.contains(&file) {
            problems.push(format!("{file}: in {} but not listed in kustomization.yaml", shown(&base_dir())));
        }
    }
    let base = load_base();
    let workloads = workloads(&base.manifests);
    let images: BTreeSet<&str> =
        workloads.iter().flat_map(|w| w.containers()).filter_map(|c| c.image.as_deref()).collect();
    for image in &k.images {
        if !images.contains(image.name.as_str()) {
            problems.push(format!("images: {} is no container's image ({images:?})", image.name));
        }
        if image.new_name.is_none() || image.new_tag.is_none() {
            problems.push(format!("images: {} needs newName and newTag", image.name));
        }
    }
    assert_no_problems("kustomization.yaml", &problems);
}

/// Files below `dir` (recursively), as paths relative to it with `/` separators.
fn files_under(dir: &Path, prefix: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", shown(dir)));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("list {}: {e}", shown(dir)));
        let path = entry.path();
        let rel = prefix.join(entry.file_name());
        if path.is_dir() {
            files.extend(files_under(&path, &rel));
        } else {
            files.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
    files
}

#[test]
fn every_manifest_parses_into_its_kubernetes_type_without_unknown_fields() {
    let base = load_base();
    assert_no_problems("Kubernetes manifests", &base.parse_problems);
    let kinds: BTreeSet<&str> = base
        .manifests
        .iter()
        .map(|m| match &m.object {
            Object::Namespace(_) => "Namespace",
            Object::ServiceAccount(_) => "ServiceAccount",
            Object::ConfigMap(_) => "ConfigMap",
            Object::Service(_) => "Service",
            Object::Deployment(_) => "Deployment",
            Object::StatefulSet(_) => "StatefulSet",
            Object::Hpa(_) => "HorizontalPodAutoscaler",
            Object::Pdb(_) => "PodDisruptionBudget",
            Object::Role(_) => "Role",
            Object::RoleBinding(_) => "RoleBinding",
            Object::ClusterRole(_) => "ClusterRole",
            Object::ClusterRoleBinding(_) => "ClusterRoleBinding",
        })
        .collect();
    for kind in ["Namespace", "Deployment", "StatefulSet", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget"]
    {
        assert!(kinds.contains(kind), "no {kind} in the manifests (found {kinds:?})");
    }
}

#[test]
fn the_unknown_field_check_catches_a_typo() {
    let doc = json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"},
        "spec": {"replica": 3, "selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c"}]}}}
    });
    let err = parse_object(&doc).err().expect("a misspelled field must be refused");
    assert!(err.contains("spec.replica"), "the error should name spec.replica: {err}");
}

#[test]
fn namespaced_objects_live_in_the_kustomization_namespace() {
    let base = load_base();
    let ns = &base.kustomization.namespace;
    let mut problems = Vec::new();
    let mut namespace_defined = false;
    for m in &base.manifests {
        let meta = match &m.object {
            Object::Namespace(n) => {
                namespace_defined |= n.metadata.name.as_ref() == Some(ns);
                continue;
            }
            Object::ClusterRole(_) | Object::ClusterRoleBinding(_) => continue,
            Object::ServiceAccount(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::Service(o) => &o.metadata,
            Object::Deployment(o) => &o.metadata,
            Object::StatefulSet(o) => &o.metadata,
            Object::Hpa(o) => &o.metadata,
            Object::Pdb(o) => &o.metadata,
            Object::Role(o) => &o.metadata,
            Object::RoleBinding(o) => &o.metadata,
        };
        if meta.namespace.as_ref() != Some(ns) {
            problems.push(format!("{}: metadata.namespace {:?}, expected {ns:?}", m.at(), meta.namespace));
        }
    }
    if !namespace_defined {
        problems.push(format!("no Namespace {ns} among the resources"));
    }
    assert_no_problems("namespaces", &problems);
}

#[test]
fn workload_selectors_match_their_pod_templates() {
    let base = load_base();
    let mut problems = Vec::new();
    for w in workloads(&base.manifests) {
        match selects(w.selector, &w.labels()) {
            Ok(true) => {}
            Ok(false) => problems.push(format!(
                "{} ({} {}): selector {:?} does not match template labels {:?}",
                w.at,
                w.kind,
                w.name,
                w.selector.match_labels,
                w.labels()
            )),
            Err(e) => problems.push(format!("{} ({} {}): {e}", w.at, w.kind, w.name)),
        }
    }
    assert_no_problems("workload selectors", &problems);
}

/// Workloads selected by `selector`, or a problem.
fn selected<'a>(selector: &LabelSelector, workloads: &'a [Workload<'a>]) -> Result<Vec<&'a Workload<'a>>, String> {
    let mut out = Vec::new();
    for w in workloads {
        if selects(selector, &w.labels())? {
            out.push(w);
        }
    }
    if out.is_empty() {
        Err(format!("selector {:?} matches no workload", selector.match_labels))
    } else {
        Ok(out)
    }
}

#[test]
fn service_selectors_and_ports_match_a_workload() {
    let base = load_base();
    let workloads = workloads(&base.manifests);
    let mut problems = Vec::new();
    for m in &base.manifests {
        let Object::Service(svc) = &m.object else { continue };
        let Some(spec) = &svc.spec else {
            problems.push(format!("{}: no spec", m.at()));
            continue;
        };
        let selector = LabelSelector { match_labels: spec.selector.clone(), ..Default::default() };
        let targets = match selected(&selector, &workloads) {
            Ok(t) => t,
            Err(e) => {
                problems.push(format!("{}: Service {:?}: {e}", m.at(), svc.metadata.name));
                continue;
            }
        };
        for port in spec.ports.iter().flatten() {
            for w in &targets {
                if !serves_port(w, port) {
                    problems.push(format!(
                        "{}: Service {:?} port {} targets {:?}, which {} {} has no container port for",
                        m.at(),
                        svc.metadata.name,
                        port.port,
                        port.target_port,
                        w.kind,
                        w.name
                    ));
                }
            }
        }
    }
    assert_no_problems("Services", &problems);
}

fn serves_port(w: &Workload, port: &ServicePort) -> bool {
    let ports: Vec<(Option<&str>, i32)> = w.containers().iter().flat_map(container_ports).collect();
    match &port.target_port {
        Some(IntOrString::String(name)) => ports.iter().any(|(n, _)| *n == Some(name.as_str())),
        Some(IntOrString::Int(number)) => ports.iter().any(|(_, p)| p == number),
        None => ports.iter().any(|(_, p)| *p == port.port),
    }
}

#[test]
fn disruption_budgets_and_the_autoscaler_target_existing_workloads() {
    let base = load_base();
    let workloads = workloads(&base.manifests);
    let mut problems = Vec::new();
    for m in &base.manifests {
        match &m.object {
            Object::Pdb(pdb) => {
                let selector = pdb.spec.as_ref().and_then(|s| s.selector.clone()).unwrap_or_default();
                if let Err(e) = selected(&selector, &workloads) {
                    problems.push(format!("{}: PodDisruptionBudget {:?}: {e}", m.at(), pdb.metadata.name));
                }
            }
            Object::Hpa(hpa) => {
                problems.extend(hpa_problems(hpa, &workloads).into_iter().map(|p| format!("{}: {p}", m.at())))
            }
            _ => {}
        }
    }
    assert_no_problems("PodDisruptionBudgets and HorizontalPodAutoscalers", &problems);
}

fn hpa_problems(hpa: &HorizontalPodAutoscaler, workloads: &[Workload]) -> Vec<String> {
    let Some(spec) = &hpa.spec else { return vec!["HorizontalPodAutoscaler without spec".into()] };
    let target = &spec.scale_target_ref;
    let Some(w) = workloads.iter().find(|w| w.kind == target.kind && w.name == target.name) else {
        return vec![format!("scaleTargetRef {} {} does not exist", target.kind, target.name)];
    };
    let mut problems = Vec::new();
    if spec.min_replicas.unwrap_or(1) > spec.max_replicas {
        problems.push(format!("minReplicas {:?} > maxReplicas {}", spec.min_replicas, spec.max_replicas));
    }
    if w.replicas.is_some() {
        problems.push(format!("{} {} sets replicas although the autoscaler owns them", w.kind, w.name));
    }
    let scales_on_cpu = spec.metrics.iter().flatten().any(|m| m.resource.as_ref().is_some_and(|r| r.name == "cpu"));
    for c in w.containers() {
        let has_cpu_request =
            c.resources.as_ref().and_then(|r| r.requests.as_ref()).is_some_and(|r| r.contains_key("cpu"));
        if scales_on_cpu && !has_cpu_request {
            problems.push(format!("container {} has no CPU request: CPU utilization is undefined", c.name));
        }
    }
    problems
}

#[test]
fn mounted_config_maps_keys_and_paths_exist() {
    let base = load_base();
    let maps = config_maps(&base);
    let mut problems = Vec::new();
    for w in workloads(&base.manifests) {
        problems
            .extend(mount_problems(&w, &maps).into_iter().map(|p| format!("{} ({} {}): {p}", w.at, w.kind, w.name)));
    }
    assert_no_problems("volumes and mounts", &problems);
}

#[test]
fn watched_config_maps_update_in_place_and_envoy_bootstraps_roll() {
    // meshpilot watches its mounted config and applies edits live: a name hash would instead
    // replace the ConfigMap and roll every ingest node. Envoy reads its bootstrap only at start:
    // there the hash is what makes a change take effect.
    let base = load_base();
    let mut problems = Vec::new();
    for w in workloads(&base.manifests) {
        let mounted: BTreeMap<&str, &str> = w
            .volumes()
            .iter()
            .filter_map(|v| v.config_map.as_ref().map(|cm| (v.name.as_str(), cm.name.as_str())))
            .collect();
        for c in w.containers() {
            for vm in c.volume_mounts.iter().flatten() {
                let Some(name) = mounted.get(vm.name.as_str()) else { continue };
                let Some(generator) = base.kustomization.config_map_generator.iter().find(|g| g.name == *name) else {
                    continue;
                };
                if is_meshpilot(c) == generator.hashed() {
                    let want = if is_meshpilot(c) { "disableNameSuffixHash: true" } else { "a name hash" };
                    problems.push(format!("{}: container {} mounts {name}, which needs {want}", w.at, c.name));
                }
            }
        }
    }
    assert_no_problems("ConfigMap name hashes", &problems);
}

/// What one mount provides: a directory from a volume, and the files a ConfigMap volume holds.
struct Mount<'a> {
    path: &'a str,
    /// Files in the mounted directory, if it is a ConfigMap volume.
    files: Option<BTreeSet<String>>,
}

fn mount_problems(w: &Workload, maps: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut problems = Vec::new();
    // Volume name → files it provides (None: not a ConfigMap, anything goes).
    let mut volumes: BTreeMap<&str, Option<BTreeSet<String>>> = w.claims.iter().map(|c| (*c, None)).collect();
    for v in w.volumes() {
        let files = match &v.config_map {
            None => None,
            Some(cm) => {
                let Some(keys) = maps.get(&cm.name) else {
                    if cm.optional != Some(true) {
                        problems.push(format!("volume {}: ConfigMap {} does not exist", v.name, cm.name));
                    }
                    continue;
                };
                match &cm.items {
                    None => Some(keys.clone()),
                    Some(items) => {
                        for item in items.iter().filter(|i| !keys.contains(&i.key)) {
                            problems.push(format!("volume {}: ConfigMap {} has no key {}", v.name, cm.name, item.key));
                        }
                        Some(items.iter().map(|i| i.path.clone()).collect())
                    }
                }
            }
        };
        volumes.insert(&v.name, files);
    }
    for c in w.containers() {
        let mut mounts = Vec::new();
        for vm in c.volume_mounts.iter().flatten() {
            let Some(files) = volumes.get(vm.name.as_str()) else {
                problems.push(format!("container {}: volumeMount {} names no volume", c.name, vm.name));
                continue;
            };
            if let (Some(sub), Some(files)) = (&vm.sub_path, files) {
                if !files.contains(sub) {
                    problems.push(format!("container {}: subPath {sub} is not in volume {}", c.name, vm.name));
                }
                continue;
            }
            mounts.push(Mount { path: &vm.mount_path, files: files.clone() });
        }
        for arg in c.args.iter().flatten() {
            let path = arg.split_once('=').map_or(arg.as_str(), |(_, v)| v);
            if path.starts_with('/') {
                if let Err(e) = provided(path, &mounts) {
                    problems.push(format!("container {}: argument {arg}: {e}", c.name));
                }
            }
        }
    }
    problems
}

/// Whether `path` exists in a container with `mounts` (the image's own files are not known
/// here: every absolute path an argument names must come from a mount).
fn provided(path: &str, mounts: &[Mount]) -> Result<(), String> {
    let mount = mounts
        .iter()
        .filter(|m| path == m.path || path.starts_with(&format!("{}/", m.path.trim_end_matches('/'))))
        .max_by_key(|m| m.path.len())
        .ok_or_else(|| "no volume is mounted there".to_string())?;
    let rest = path[mount.path.len()..].trim_start_matches('/');
    match &mount.files {
        Some(files) if !rest.is_empty() && !files.contains(rest) => {
            Err(format!("{} holds {files:?}, not {rest}", mount.path))
        }
        _ => Ok(()),
    }
}

#[test]
fn containers_use_only_defined_flags_and_variables() {
    let base = load_base();
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for w in workloads(&base.manifests) {
        for c in w.containers() {
            let at = format!("{} ({} {}, container {})", w.at, w.kind, w.name, c.name);
            problems.extend(undefined_variables(c).into_iter().map(|p| format!("{at}: {p}")));
            if !is_meshpilot(c) {
                continue;
            }
            match parse_cli(c.args.as_deref().unwrap_or_default()) {
                Ok(cli) => {
                    seen.insert(cli.subcommand);
                }
                Err(errors) => problems.extend(errors.into_iter().map(|e| format!("{at}: {e}"))),
            }
            if c.command.is_some() {
                problems.push(format!("{at}: `command` overrides the image's meshpilot entrypoint"));
            }
        }
    }
    assert_no_problems("container command lines", &problems);
    assert_eq!(seen, BTreeSet::from(["frontend".to_string(), "ingest".to_string()]), "meshpilot containers");
}

/// `$(VAR)` references Kubernetes would leave unexpanded: VAR must be defined in the container's
/// `env` (before the referencing variable, for references from `env` values).
fn undefined_variables(c: &Container) -> Vec<String> {
    let env = c.env.as_deref().unwrap_or_default();
    let mut problems = Vec::new();
    for (i, var) in env.iter().enumerate() {
        for name in var.value.as_deref().map(var_refs).unwrap_or_default() {
            if !env[..i].iter().any(|e| e.name == name) {
                problems.push(format!("env {} uses $({name}) before it is defined", var.name));
            }
        }
    }
    for arg in c.command.iter().flatten().chain(c.args.iter().flatten()) {
        for name in var_refs(arg) {
            if !env.iter().any(|e| e.name == name) {
                problems.push(format!("argument {arg:?} uses $({name}), which env does not define"));
            }
        }
    }
    problems
}

#[test]
fn service_accounts_and_rbac_references_resolve_and_only_read() {
    let base = load_base();
    let mut accounts = BTreeSet::new();
    let mut roles = BTreeSet::new();
    let mut cluster_roles = BTreeSet::new();
    let mut rules: Vec<(String, &PolicyRule)> = Vec::new();
    for m in &base.manifests {
        match &m.object {
            Object::ServiceAccount(sa) => {
                accounts.insert(sa.metadata.name.clone().unwrap_or_default());
            }
            Object::Role(r) => {
                roles.insert(r.metadata.name.clone().unwrap_or_default());
                rules.extend(r.rules.iter().flatten().map(|rule| (m.at(), rule)));
            }
            Object::ClusterRole(r) => {
                cluster_roles.insert(r.metadata.name.clone().unwrap_or_default());
                rules.extend(r.rules.iter().flatten().map(|rule| (m.at(), rule)));
            }
            _ => {}
        }
    }
    let mut problems = Vec::new();
    for m in &base.manifests {
        let (role_ref, subjects) = match &m.object {
            Object::RoleBinding(b) => (&b.role_ref, &b.subjects),
            Object::ClusterRoleBinding(b) => (&b.role_ref, &b.subjects),
            _ => continue,
        };
        let known = match role_ref.kind.as_str() {
            "Role" => roles.contains(&role_ref.name),
            "ClusterRole" => cluster_roles.contains(&role_ref.name),
            _ => false,
        };
        if !known {
            problems.push(format!("{}: roleRef {} {} does not exist", m.at(), role_ref.kind, role_ref.name));
        }
        for s in subjects.iter().flatten() {
            if s.kind != "ServiceAccount" || !accounts.contains(&s.name) {
                problems.push(format!(
                    "{}: subject {} {} is not a ServiceAccount defined here",
                    m.at(),
                    s.kind,
                    s.name
                ));
            }
        }
    }
    for w in workloads(&base.manifests) {
        match w.template.spec.as_ref().and_then(|s| s.service_account_name.as_ref()) {
            Some(sa) if accounts.contains(sa) => {}
            other => problems.push(format!("{}: serviceAccountName {other:?} is not defined here", w.at)),
        }
    }
    for (at, rule) in rules {
        for verb in rule.verbs.iter().filter(|v| !["get", "list", "watch"].contains(&v.as_str())) {
            problems.push(format!("{at}: verb {verb:?}: meshpilot only reads"));
        }
        if rule.resources.iter().flatten().chain(rule.api_groups.iter().flatten()).any(|r| r == "*") {
            problems.push(format!("{at}: wildcard resources or API groups"));
        }
    }
    assert_no_problems("service accounts and RBAC", &problems);
}

#[test]
fn pods_meet_the_restricted_pod_security_standard_and_are_probed_and_sized() {
    let base = load_base();
    let mut problems = Vec::new();
    for w in workloads(&base.manifests) {
        let at = format!("{} ({} {})", w.at, w.kind, w.name);
        problems.extend(pod_problems(&w).into_iter().map(|p| format!("{at}: {p}")));
    }
    assert_no_problems("pod security, probes and resources", &problems);
}

fn pod_problems(w: &Workload) -> Vec<String> {
    let Some(spec) = &w.template.spec else { return vec!["no pod spec".into()] };
    let pod = spec.security_context.clone().unwrap_or_default();
    let mut problems = Vec::new();
    if pod.run_as_non_root != Some(true) {
        problems.push("securityContext.runAsNonRoot is not true".into());
    }
    if pod.run_as_user == Some(0) {
        problems.push("runs as root (runAsUser 0)".into());
    }
    if pod.seccomp_profile.as_ref().map(|s| s.type_.as_str()) != Some("RuntimeDefault") {
        problems.push("securityContext.seccompProfile is not RuntimeDefault".into());
    }
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true) {
        problems.push("uses host namespaces".into());
    }
    for v in w.volumes() {
        let allowed = v.config_map.is_some()
            || v.empty_dir.is_some()
            || v.secret.is_some()
            || v.persistent_volume_claim.is_some()
            || v.downward_api.is_some()
            || v.projected.is_some();
        if !allowed {
            problems.push(format!("volume {}: a type the restricted standard forbids", v.name));
        }
    }
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        problems.extend(container_problems(c).into_iter().map(|p| format!("container {}: {p}", c.name)));
    }
    problems
}

fn container_problems(c: &Container) -> Vec<String> {
    let sc = c.security_context.clone().unwrap_or_default();
    let mut problems = Vec::new();
    if sc.allow_privilege_escalation != Some(false) {
        problems.push("allowPrivilegeEscalation is not false".to_string());
    }
    if !sc.capabilities.and_then(|caps| caps.drop).is_some_and(|d| d.iter().any(|c| c == "ALL")) {
        problems.push("capabilities.drop lacks ALL".into());
    }
    if sc.read_only_root_filesystem != Some(true) {
        problems.push("readOnlyRootFilesystem is not true".into());
    }
    if sc.privileged == Some(true) || sc.run_as_user == Some(0) {
        problems.push("privileged or root".into());
    }
    if c.readiness_probe.is_none() || c.liveness_probe.is_none() {
        problems.push("needs a readiness and a liveness probe".into());
    }
    let resources = c.resources.clone().unwrap_or_default();
    let requests = resources.requests.unwrap_or_default();
    if !requests.contains_key("cpu") || !requests.contains_key("memory") {
        problems.push("needs CPU and memory requests".into());
    }
    if !resources.limits.unwrap_or_default().contains_key("memory") {
        problems.push("needs a memory limit".into());
    }
    problems
}

// ---------------------------------------------------------------------------------------------
// Config the deployment ships

#[test]
fn shipped_istio_and_mesh_config_are_the_examples_and_valid() {
    let base = load_base();
    let mut problems = Vec::new();
    for generator in &base.kustomization.config_map_generator {
        for (key, file) in generator.entries() {
            let (original, is_istio) = match generator.name.as_str() {
                "meshpilot-istio-config" => (repo().join("examples/bookinfo").join(&key), true),
                "meshpilot-mesh" => (repo().join("examples/mesh.yaml"), false),
                _ => continue,
            };
            let copy = base_dir().join(&file);
            if read(&copy) != read(&original) {
                problems.push(format!("{} differs from {} (copy it again)", shown(&copy), shown(&original)));
            }
            let text = read(&copy);
            if is_istio {
                for doc in meshpilot::config::parse::parse_file(&shown(&copy), &text) {
                    if let Document::Invalid(e) = doc {
                        problems.push(format!("{}: invalid: {e}", shown(&copy)));
                    }
                }
            } else if let Err(e) = meshpilot::mesh::MeshConfig::parse(&shown(&copy), &text) {
                problems.push(format!("{}: invalid mesh config: {e}", shown(&copy)));
            }
        }
    }
    assert_no_problems("shipped config", &problems);
}

/// Every Envoy bootstrap under deploy/: the kustomize ones (generator files under envoy/) and
/// deploy/local's YAML files.
fn envoy_bootstraps() -> Vec<PathBuf> {
    let k = kustomization();
    let mut files: Vec<PathBuf> = k
        .config_map_generator
        .iter()
        .flat_map(|g| g.entries().map(|(_, file)| file))
        .filter(|file| file.starts_with("envoy/"))
        .map(|file| base_dir().join(file))
        .collect();
    let local = std::fs::read_dir(local_dir()).unwrap_or_else(|e| panic!("list deploy/local: {e}"));
    for entry in local {
        let path = entry.unwrap_or_else(|e| panic!("list deploy/local: {e}")).path();
        if path.extension().is_some_and(|e| e == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn envoy_bootstraps_pass_envoy_validate() {
    let envoy = support::envoy_path();
    let bootstraps = envoy_bootstraps();
    assert!(bootstraps.len() >= 4, "expected the LB and proxy bootstraps, found {bootstraps:?}");
    let mut problems = Vec::new();
    for path in &bootstraps {
        yaml_value(path); // plain YAML, one mapping
        let out = Command::new(&envoy)
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(path)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", envoy.display()));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            problems.push(format!("{}: envoy --mode validate failed:\n{text}", shown(path)));
        } else if text.contains("Deprecated field") {
            problems.push(format!("{}: uses deprecated Envoy fields:\n{text}", shown(path)));
        }
    }
    assert_no_problems("Envoy bootstraps", &problems);
    warn_if_image_differs(&envoy);
}

/// The LB image should be the Envoy version the bootstraps were validated with.
fn warn_if_image_differs(envoy: &Path) {
    let Ok(out) = Command::new(envoy).arg("--version").output() else { return };
    let version = String::from_utf8_lossy(&out.stdout).split('/').nth(1).unwrap_or_default().to_string();
    let manifest = read(&base_dir().join("xds-lb.yaml"));
    if !version.is_empty() && !manifest.contains(&format!("envoyproxy/envoy:v{version}")) {
        eprintln!(
            "note: deploy/kustomize/base/xds-lb.yaml does not use envoyproxy/envoy:v{version}, the validating Envoy"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The load balancers and the frontends' ownership

/// The element of `array` (a JSON array at `what`) whose `name` is `name`.
fn named<'a>(array: &'a Value, name: &str, what: &str) -> &'a Value {
    array
        .as_array()
        .and_then(|a| a.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("{what}: nothing named {name:?}"))
}

/// The HTTP connection manager of listener `name`.
fn http_connection_manager<'a>(bootstrap: &'a Value, name: &str, what: &str) -> &'a Value {
    let listener = named(&bootstrap["static_resources"]["listeners"], name, what);
    &listener["filter_chains"][0]["filters"][0]["typed_config"]
}

/// Problems of a load balancer bootstrap's hashing: the route hashes the proxy-key header into
/// cluster `frontends`, a MAGLEV cluster with meshpilot's table size: the algorithm and size
/// the frontends compute ownership with (`Ownership::new(ids, ProxyHashing::default())`).
fn hashing_problems(bootstrap: &Value, what: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let hcm = http_connection_manager(bootstrap, "xds", what);
    let route = &hcm["route_config"]["virtual_hosts"][0]["routes"][0]["route"];
    if route["cluster"] != "frontends" {
        problems.push(format!("the xds route goes to {}, not frontends", route["cluster"]));
    }
    if route["hash_policy"] != json!([{"header": {"header_name": PROXY_KEY_HEADER}}]) {
        problems.push(format!("hash_policy {} is not the header {PROXY_KEY_HEADER} alone", route["hash_policy"]));
    }
    if route["timeout"] != "0s" || hcm["stream_idle_timeout"] != "0s" {
        problems.push("ADS streams need route timeout 0s and stream_idle_timeout 0s".into());
    }
    let cluster = named(&bootstrap["static_resources"]["clusters"], "frontends", what);
    // The frontends compute ownership with the default hashing: the LB must use that algorithm.
    if ProxyHashing::default() != ProxyHashing::Maglev {
        problems.push(format!("the frontends hash by {:?}, this checks for Maglev", ProxyHashing::default()));
    }
    if cluster["lb_policy"] != "MAGLEV" {
        problems.push(format!("lb_policy {} is not MAGLEV", cluster["lb_policy"]));
    }
    if !cluster["load_balancing_policy"].is_null() {
        problems.push("load_balancing_policy would override lb_policy MAGLEV".into());
    }
    let size = json!({"table_size": MaglevSettings::default().table_size});
    if cluster["maglev_lb_config"] != size {
        problems.push(format!("maglev_lb_config {} is not meshpilot's {size}", cluster["maglev_lb_config"]));
    }
    if !cluster["common_lb_config"].is_null() {
        problems.push("common_lb_config (hostname hashing, locality weights...) changes the table".into());
    }
    problems.into_iter().map(|p| format!("{what}: {p}")).collect()
}

/// The `x-meshpilot-proxy-key` a proxy bootstrap sends must be the key the frontends compute
/// from its node metadata (namespace-service-account). Returns the xds cluster's address.
fn proxy_bootstrap_problems(bootstrap: &Value, what: &str) -> (Vec<String>, (String, u64)) {
    let mut problems = Vec::new();
    let meta = &bootstrap["node"]["metadata"];
    let expected =
        format!("{}/{}", meta["NAMESPACE"].as_str().unwrap_or("?"), meta["SERVICE_ACCOUNT"].as_str().unwrap_or("?"));
    let service = &bootstrap["dynamic_resources"]["ads_config"]["grpc_services"][0];
    let metadata = json!([{"key": PROXY_KEY_HEADER, "value": expected}]);
    if service["initial_metadata"] != metadata {
        problems.push(format!("{what}: initial_metadata {} should be {metadata}", service["initial_metadata"]));
    }
    let cluster_name = service["envoy_grpc"]["cluster_name"].as_str().unwrap_or_default();
    let cluster = named(&bootstrap["static_resources"]["clusters"], cluster_name, what);
    let socket =
        &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    let addr = (socket["address"].as_str().unwrap_or_default().to_string(), socket["port_value"].as_u64().unwrap_or(0));
    (problems, addr)
}

/// The single frontend Deployment's meshpilot container and parsed command line.
fn frontend_container<'a>(workloads: &'a [Workload<'a>]) -> (&'a Workload<'a>, &'a Container, Cli) {
    let mut found = Vec::new();
    for w in workloads {
        for c in w.containers().iter().filter(|c| is_meshpilot(c)) {
            let cli = parse_cli(c.args.as_deref().unwrap_or_default()).unwrap_or_else(|e| panic!("{}: {e:?}", w.at));
            if cli.subcommand == "frontend" {
                found.push((w, c, cli));
            }
        }
    }
    assert_eq!(found.len(), 1, "expected exactly one frontend container");
    found.remove(0)
}

#[test]
fn kubernetes_load_balancer_hashes_frontends_by_address_as_they_name_themselves() {
    let base = load_base();
    let workloads = workloads(&base.manifests);
    let ns = &base.kustomization.namespace;
    let (frontend, container, cli) = frontend_container(&workloads);
    let mut problems = Vec::new();

    // The frontends' member id is their address, which is what Envoy hashes STRICT_DNS hosts by.
    let xds_port = cli.flags.get("--xds-addr").and_then(|a| port_of(a)).expect("frontend --xds-addr with a port");
    let own_addr = format!("$(POD_IP):{xds_port}");
    for flag in ["--id", "--advertise-addr"] {
        if cli.flags.get(flag) != Some(&own_addr) {
            problems.push(format!("frontend {flag} is {:?}, must be {own_addr}", cli.flags.get(flag)));
        }
    }
    let pod_ip = container.env.iter().flatten().find(|e| e.name == "POD_IP");
    let field = pod_ip.and_then(|e| e.value_from.as_ref()).and_then(|f| f.field_ref.as_ref());
    if field.map(|f| f.field_path.as_str()) != Some("status.podIP") {
        problems.push("frontend env POD_IP must come from status.podIP".into());
    }

    // The LB resolves the frontends' headless Service.
    let services: Vec<&Service> =
        base.manifests.iter().filter_map(|m| if let Object::Service(s) = &m.object { Some(s) } else { None }).collect();
    let frontend_service = services
        .iter()
        .find(|s| {
            let selector =
                LabelSelector { match_labels: s.spec.as_ref().and_then(|x| x.selector.clone()), ..Default::default() };
            selects(&selector, &frontend.labels()).unwrap_or(false)
        })
        .expect("a Service selecting the frontends");
    let spec = frontend_service.spec.as_ref().expect("frontend Service spec");
    if spec.cluster_ip.as_deref() != Some("None") || spec.publish_not_ready_addresses == Some(true) {
        problems.push("the frontend Service must be headless and list ready pods only".into());
    }
    let service_port = spec.ports.iter().flatten().find(|p| p.port == i32::from(xds_port));
    if service_port.is_none() {
        problems.push(format!("the frontend Service has no port {xds_port}"));
    }

    let lb_path = generated_file(&base, "meshpilot-xds-lb-bootstrap", "xds-lb.yaml");
    let lb = yaml_value(&lb_path);
    let what = shown(&lb_path);
    problems.extend(hashing_problems(&lb, &what));
    let cluster = named(&lb["static_resources"]["clusters"], "frontends", &what);
    let dns = &cluster["cluster_type"];
    if dns["name"] != "envoy.clusters.dns"
        || dns["typed_config"]["all_addresses_in_single_endpoint"] != false
        || dns["typed_config"]["dns_lookup_family"] != "V4_ONLY"
    {
        problems.push(format!("{what}: frontends must be strict DNS (one host per address), IPv4: {dns}"));
    }
    let endpoints = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"];
    let expected = json!([{"endpoint": {"address": {"socket_address": {
        "address": format!("{}.{ns}.svc", frontend_service.metadata.name.as_deref().unwrap_or_default()),
        "port_value": xds_port
    }}}}]);
    if *endpoints != expected {
        problems.push(format!("{what}: lb_endpoints {endpoints} should be exactly {expected} (no hash_key metadata)"));
    }

    // Proxies reach the LB Service and send their key.
    let sidecar_path = generated_file(&base, "meshpilot-example-sidecar-bootstrap", "sidecar-bootstrap.yaml");
    let (more, (host, port)) = proxy_bootstrap_problems(&yaml_value(&sidecar_path), &shown(&sidecar_path));
    problems.extend(more);
    let lb_service =
        services.iter().find(|s| s.metadata.name.as_deref() == Some("meshpilot-xds")).expect("Service meshpilot-xds");
    let lb_ports: Vec<i32> = lb_service.spec.iter().flat_map(|s| s.ports.iter().flatten()).map(|p| p.port).collect();
    if host != format!("meshpilot-xds.{ns}.svc") || !lb_ports.contains(&i32::try_from(port).unwrap_or(-1)) {
        problems.push(format!("{}: the xds cluster points at {host}:{port}, not meshpilot-xds", shown(&sidecar_path)));
    }
    assert_no_problems("Kubernetes load balancer", &problems);
}

#[test]
fn local_load_balancer_hashes_the_frontend_ids_run_local_starts() {
    let lb_path = local_dir().join("xds-lb.yaml");
    let lb = yaml_value(&lb_path);
    let what = shown(&lb_path);
    let mut problems = hashing_problems(&lb, &what);

    // Frontends run-local.sh starts: id → xDS port.
    let mut frontends = BTreeMap::new();
    for (line, args) in run_local_command_lines() {
        match parse_cli(&args) {
            Ok(cli) if cli.subcommand == "frontend" => {
                let id = cli.flags.get("--id").cloned().unwrap_or_default();
                let port = cli.flags.get("--xds-addr").and_then(|a| port_of(a));
                frontends.insert(id, port);
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("run-local.sh line {line}: {e:?}")),
        }
    }
    let cluster = named(&lb["static_resources"]["clusters"], "frontends", &what);
    let mut endpoints = BTreeMap::new();
    for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().into_iter().flatten() {
        let id = e["metadata"]["filter_metadata"]["envoy.lb"]["hash_key"].as_str().unwrap_or_default().to_string();
        let port =
            e["endpoint"]["address"]["socket_address"]["port_value"].as_u64().and_then(|p| u16::try_from(p).ok());
        endpoints.insert(id, port);
    }
    if endpoints != frontends {
        problems
            .push(format!("{what}: endpoints (hash_key → port) {endpoints:?} != run-local.sh frontends {frontends:?}"));
    }
    let (more, (host, port)) =
        proxy_bootstrap_problems(&yaml_value(&local_dir().join("envoy-sidecar.yaml")), "envoy-sidecar.yaml");
    problems.extend(more);
    let listener = named(&lb["static_resources"]["listeners"], "xds", &what);
    let socket = &listener["address"]["socket_address"];
    if socket["address"] != host || socket["port_value"] != port {
        problems.push(format!("deploy/local/envoy-sidecar.yaml connects to {host}:{port}, the LB listens on {socket}"));
    }
    assert_no_problems("local load balancer", &problems);
}

#[test]
fn run_local_script_is_valid_bash_and_starts_every_component() {
    let script = local_dir().join("run-local.sh");
    let out = Command::new("bash").arg("-n").arg(&script).output().expect("run bash -n");
    assert!(out.status.success(), "bash -n {}: {}", shown(&script), String::from_utf8_lossy(&out.stderr));
    let mut count = BTreeMap::new();
    for (line, args) in run_local_command_lines() {
        let cli = parse_cli(&args).unwrap_or_else(|e| panic!("run-local.sh line {line}: {e:?}"));
        *count.entry(cli.subcommand).or_insert(0) += 1;
    }
    assert_eq!(count, BTreeMap::from([("frontend".to_string(), 2), ("ingest".to_string(), 3)]), "meshpilot processes");
}

#[test]
fn ownership_does_not_depend_on_dns_answer_order_within_the_autoscaler_range() {
    // Envoy lists strict-DNS hosts as DNS answers, meshpilot lists members by id. Maglev sorts
    // hosts by hash key before filling its table, so any order gives the same table.
    let base = load_base();
    let max: Vec<usize> = base
        .manifests
        .iter()
        .filter_map(|m| if let Object::Hpa(hpa) = &m.object { hpa.spec.as_ref() } else { None })
        .map(|spec| usize::try_from(spec.max_replicas).expect("maxReplicas"))
        .collect();
    assert!(!max.is_empty(), "no HorizontalPodAutoscaler for the frontends");
    for hosts in 1..=max.into_iter().max().unwrap_or(0) {
        // Sorted ids, as membership lists them ("10.0.0.10:15010" sorts before "10.0.0.2:15010").
        let mut ids: Vec<String> = (0..hosts).map(|i| format!("10.0.{}.{}:15010", i / 200, 2 + i % 200)).collect();
        ids.sort();
        let by_id = Ownership::new(ids.clone(), ProxyHashing::default()).expect("ownership");
        let reversed: Vec<String> = ids.iter().rev().cloned().collect();
        let mut rotated = ids.clone();
        rotated.rotate_left(hosts / 2);
        for order in [reversed, rotated] {
            let by_dns = Ownership::new(order.clone(), ProxyHashing::default()).expect("ownership");
            assert_eq!(by_dns, by_id, "{hosts} hosts: the table differs for ids in DNS order {order:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// End to end: the shipped Kubernetes LB config against a stub DNS name with three frontends

/// A DNS server on 127.0.0.1 (UDP) answering A queries for one name with fixed addresses in a
/// fixed order; other names get NXDOMAIN, other types for the name no records. Stops when dropped.
struct StubDns {
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StubDns {
    fn start(name: &str, addrs: Vec<Ipv4Addr>) -> StubDns {
        let socket = UdpSocket::bind(common::ports::free_addr()).expect("bind the stub DNS socket");
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("set the stub DNS read timeout");
        let port = socket.local_addr().expect("stub DNS address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let name = name.to_ascii_lowercase();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((len, peer)) = socket.recv_from(&mut buf) else { continue };
                    if let Some(reply) = dns_reply(&buf[..len], &name, &addrs) {
                        let _ = socket.send_to(&reply, peer);
                    }
                }
            }
        });
        StubDns { port, stop, thread: Some(thread) }
    }
}

impl Drop for StubDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer to DNS `query` (RFC 1035 wire format), or None if it is not a query we can read.
fn dns_reply(query: &[u8], name: &str, addrs: &[Ipv4Addr]) -> Option<Vec<u8>> {
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = query.get(12..at + 4)?;
    let known = labels.join(".") == name;
    let answers: &[Ipv4Addr] = if known && qtype == 1 { addrs } else { &[] };
    let mut reply = query[..2].to_vec(); // id
    reply.push(0x84 | (query[2] & 0x01)); // response, authoritative, recursion desired as asked
    reply.push(if known { 0x80 } else { 0x83 }); // recursion available; NOERROR or NXDOMAIN
    reply.extend_from_slice(&[0, 1]);
    reply.extend_from_slice(&u16::try_from(answers.len()).ok()?.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(question);
    for addr in answers {
        reply.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]); // name (pointer to the question), A, IN
        reply.extend_from_slice(&5u32.to_be_bytes()); // TTL
        reply.extend_from_slice(&[0, 4]);
        reply.extend_from_slice(&addr.octets());
    }
    Some(reply)
}

/// A port free on every one of `ips`.
fn port_free_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..100 {
        let port = free_port();
        if ips.iter().all(|ip| std::net::TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on all of {ips:?}")
}

#[tokio::test]
async fn kubernetes_load_balancer_routes_each_key_to_the_frontend_owning_it() {
    const NAME: &str = "meshpilot-frontend.meshpilot-test.internal";
    // Three "frontends" on distinct loopback addresses, one port, as pods behind a headless
    // Service; each answers with its address, which is also its member id.
    let ips: Vec<Ipv4Addr> = (2..=4).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let port = port_free_on(&ips);
    let ids: Vec<String> = ips.iter().map(|ip| format!("{ip}:{port}")).collect();
    let _frontends: Vec<Backend> =
        ips.iter().zip(&ids).map(|(ip, id)| Backend::builder(id).ip(*ip).port(port).start()).collect();
    // DNS answers in an order other than meshpilot's (sorted ids).
    let dns = StubDns::start(NAME, ips.iter().rev().copied().collect());

    // The shipped listener and cluster, changed only where the test environment needs it.
    let base = load_base();
    let lb = yaml_value(&generated_file(&base, "meshpilot-xds-lb-bootstrap", "xds-lb.yaml"));
    let mut cluster = named(&lb["static_resources"]["clusters"], "frontends", "LB bootstrap").clone();
    let mut listener = named(&lb["static_resources"]["listeners"], "xds", "LB bootstrap").clone();
    let listen_port = free_port();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
        json!({"address": NAME, "port_value": port});
    cluster["cluster_type"]["typed_config"]["typed_dns_resolver_config"] = json!({
        "name": "envoy.network.dns_resolver.cares",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
            "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns.port}}],
            "dns_resolver_options": {"no_default_search_domain": true}
        }
    });
    // The test backends speak HTTP/1.1, the test client too.
    cluster.as_object_mut().expect("cluster").remove("typed_extension_protocol_options");
    listener["address"]["socket_address"] = json!({"address": "127.0.0.1", "port_value": listen_port});
    listener["filter_chains"][0]["filters"][0]["typed_config"]["codec_type"] = json!("AUTO");

    let envoy = Envoy::builder("meshpilot-xds-lb", free_addr())
        .bootstrap_patch(json!({"dynamic_resources": null}))
        .static_cluster(cluster)
        .static_listener(listener)
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    // What the frontends compute, and its table for Envoy's gauges of slots per host.
    let ownership = Ownership::new(ids.clone(), ProxyHashing::default()).expect("ownership");
    let maglev = Maglev::new(ids.clone(), MaglevSettings::default()).expect("maglev");
    assert_eq!(ownership, Ownership::from(maglev.clone()), "the frontends' default hashing is Maglev");
    let min = maglev.counts().iter().min().copied();
    let max = maglev.counts().iter().max().copied();
    let resolved = envoy
        .wait_for(STARTUP_TIMEOUT, async |e| {
            e.stat("cluster.frontends.membership_total").await == Some(3)
                && e.stat("cluster.frontends.maglev_lb.min_entries_per_host").await == min
                && e.stat("cluster.frontends.maglev_lb.max_entries_per_host").await == max
        })
        .await;
    assert!(
        resolved,
        "Envoy did not resolve {NAME} to 3 hosts with a Maglev table of {min:?}..{max:?} slots per host; log:\n{}",
        envoy.logs()
    );

    let client = http_client();
    let url = format!("http://127.0.0.1:{listen_port}/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources");
    let mut disagreements = Vec::new();
    let mut used = BTreeSet::new();
    for i in 0..300 {
        let key = format!("ns-{}/sa-{i}", i % 7);
        let resp = http_request(&client, "POST", &url, "", &[(PROXY_KEY_HEADER, &key)], Some(""))
            .await
            .unwrap_or_else(|e| panic!("request with key {key}: {e}"));
        let backend = resp.header("x-backend").unwrap_or_else(|| panic!("key {key}: no x-backend ({})", resp.status));
        used.insert(backend.to_string());
        if ownership.owner(&key) != Some(backend) {
            disagreements.push(format!("{key}: Envoy chose {backend}, the frontends {:?}", ownership.owner(&key)));
        }
    }
    assert!(disagreements.is_empty(), "{} of 300 keys disagree:\n{}", disagreements.len(), disagreements.join("\n"));
    assert_eq!(used.len(), 3, "keys should reach every frontend: {used:?}");
}
