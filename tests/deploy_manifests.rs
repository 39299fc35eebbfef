//! The Kubernetes manifests under `deploy/` hold together, in both builds (the kustomize base,
//! and the base with the config-dir component):
//! - every document parses into its k8s-openapi type, with no field the type does not know
//!   (k8s-openapi ignores unknown fields, so a typo would pass silently);
//! - references resolve: kustomization files, selectors, Service ports, mounted ConfigMaps and
//!   their keys, service accounts, RBAC, the HPA target;
//! - meshpilot containers use only the CLI's flags, and pods meet the restricted standard;
//! - ingest runs on the Kubernetes source with exactly the RBAC it needs; nothing else talks to
//!   the API server;
//! - `deploy/crds/istio-crds.yaml` defines the ten Istio kinds as valid v1 CRDs;
//! - the validating webhook reaches every ingest node on 15017 with istiod's rules.
//!
//! `deploy_config.rs` checks the config the deployment ships, `deploy_load_balancers.rs` how the
//! load balancers hash proxies onto frontends.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::deploy::cli::{is_meshpilot, parse_cli};
use common::deploy::kube::{
    expected_frontend_grants, expected_ingest_grants, grants_by_account, show_grant, ISTIO_KINDS, MESH_CONFIG_MAP,
    MESH_KEY, WEBHOOK_CONFIG, WEBHOOK_PORT, WEBHOOK_SERVICE,
};
use common::deploy::workloads::{config_maps, container_ports, selects, var_refs, workloads, Workload};
use common::deploy::*;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Container, ServicePort};
use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

#[test]
fn kustomizations_list_every_file_and_every_listed_file_exists() {
    let mut problems = Vec::new();
    for dir in kustomize_dirs() {
        let at = shown(&dir.join("kustomization.yaml"));
        problems.extend(kustomization_problems(&dir).into_iter().map(|p| format!("{at}: {p}")));
    }
    assert_no_problems("kustomizations", &problems);
}

fn kustomization_problems(dir: &Path) -> Vec<String> {
    let k = kustomization_in(dir);
    let mut problems = Vec::new();
    let expected = if dir == config_dir_component() {
        ("kustomize.config.k8s.io/v1alpha1", "Component")
    } else {
        ("kustomize.config.k8s.io/v1beta1", "Kustomization")
    };
    if (k.api_version.as_str(), k.kind.as_str()) != expected {
        problems.push(format!("apiVersion/kind {}/{}, expected {expected:?}", k.api_version, k.kind));
    }
    // Files this kustomization names (directories: other kustomizations, which list their own).
    let mut listed = BTreeSet::new();
    let generated = k.config_map_generator.iter().flat_map(|g| g.entries().map(|(_, file)| file));
    let patches = k.patches.iter().map(|p| p.path.clone());
    for entry in k.resources.iter().chain(&k.components).cloned().chain(generated).chain(patches) {
        let path = dir.join(&entry);
        if path.is_dir() && path.join("kustomization.yaml").is_file() {
            continue;
        }
        if !path.is_file() {
            problems.push(format!("{entry}: listed but missing"));
        }
        if !listed.insert(entry.clone()) {
            problems.push(format!("{entry}: listed twice"));
        }
    }
    for file in files_under(dir, Path::new("")) {
        if file != "kustomization.yaml" && !listed.contains(&file) {
            problems.push(format!("{file}: in the directory but not listed"));
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
    problems
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
    for build in builds() {
        assert_no_problems(&format!("Kubernetes manifests of {}", build.name), &build.parse_problems);
    }
    let base = load_base();
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
            Object::ValidatingWebhook(_) => "ValidatingWebhookConfiguration",
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
    let ns = &base.namespace;
    let mut problems = Vec::new();
    if ns.is_empty() {
        problems.push("the base's kustomization sets no namespace".to_string());
    }
    for build in builds() {
        if build.namespace != *ns {
            problems.push(format!("{} puts objects in {:?}, not the base's {ns:?}", build.name, build.namespace));
        }
    }
    let mut namespace_defined = false;
    for m in &base.manifests {
        let meta = match &m.object {
            Object::Namespace(n) => {
                namespace_defined |= n.metadata.name.as_ref() == Some(ns);
                continue;
            }
            Object::ClusterRole(_) | Object::ClusterRoleBinding(_) | Object::ValidatingWebhook(_) => continue,
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
    let mut problems = Vec::new();
    for build in builds() {
        let maps = config_maps(&build);
        for w in workloads(&build.manifests) {
            let at = format!("{}: {} ({} {})", build.name, w.at, w.kind, w.name);
            problems.extend(mount_problems(&w, &maps).into_iter().map(|p| format!("{at}: {p}")));
        }
    }
    assert_no_problems("volumes and mounts", &problems);
}

#[test]
fn watched_config_maps_update_in_place_and_envoy_bootstraps_roll() {
    // meshpilot watches its mounted config and applies edits live: a name hash would instead
    // replace the ConfigMap and roll every ingest node. Envoy reads its bootstrap only at start:
    // there the hash is what makes a change take effect.
    let mut problems = Vec::new();
    for build in builds() {
        problems.extend(name_hash_problems(&build));
    }
    assert_no_problems("ConfigMap name hashes", &problems);
}

fn name_hash_problems(build: &Build) -> Vec<String> {
    let mut problems = Vec::new();
    for w in workloads(&build.manifests) {
        let mounted: BTreeMap<&str, &str> = w
            .volumes()
            .iter()
            .filter_map(|v| v.config_map.as_ref().map(|cm| (v.name.as_str(), cm.name.as_str())))
            .collect();
        for c in w.containers() {
            for vm in c.volume_mounts.iter().flatten() {
                let Some(name) = mounted.get(vm.name.as_str()) else { continue };
                let Some(generator) = build.generator(name) else { continue };
                if is_meshpilot(c) == generator.hashed() {
                    let want = if is_meshpilot(c) { "disableNameSuffixHash: true" } else { "a name hash" };
                    problems.push(format!("{}: container {} mounts {name}, which needs {want}", w.at, c.name));
                }
            }
        }
    }
    problems
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
    for build in builds() {
        command_line_checks(&build);
    }
}

fn command_line_checks(build: &Build) {
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for w in workloads(&build.manifests) {
        for c in w.containers() {
            let at = format!("{}: {} ({} {}, container {})", build.name, w.at, w.kind, w.name, c.name);
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
fn service_accounts_and_rbac_references_resolve_and_only_read_or_write_events_and_ca_objects() {
    for build in builds() {
        let problems = rbac_reference_problems(&build);
        assert_no_problems(&format!("service accounts and RBAC of {}", build.name), &problems);
    }
}

fn rbac_reference_problems(base: &Build) -> Vec<String> {
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
        // Reads, and the writes meshpilot makes: Events about invalid objects, and the CA's (its
        // Secret, the root ConfigMaps, TokenReviews); which names, the exact-grants test pins.
        let writable = |allowed: &[&str]| rule.resources.iter().flatten().all(|r| allowed.contains(&r.as_str()));
        for verb in &rule.verbs {
            let read = ["get", "list", "watch"].contains(&verb.as_str());
            let write = match verb.as_str() {
                "create" => writable(&["events", "secrets", "configmaps", "tokenreviews"]),
                "patch" => writable(&["events", "configmaps", "validatingwebhookconfigurations"]),
                // The webhook configuration's caBundle; the exact-grants test pins its name.
                "update" => writable(&["validatingwebhookconfigurations"]),
                _ => false,
            };
            if !read && !write {
                problems.push(format!(
                    "{at}: verb {verb:?}: meshpilot only reads, and writes only Events and the CA's objects"
                ));
            }
        }
        let names = [&rule.resources, &rule.api_groups, &rule.resource_names, &rule.non_resource_urls];
        if names.iter().flat_map(|n| n.iter().flatten()).chain(&rule.verbs).any(|r| r.contains('*')) {
            problems.push(format!("{at}: a wildcard"));
        }
        if rule.non_resource_urls.is_some() {
            problems.push(format!("{at}: nonResourceURLs (API discovery needs none)"));
        }
    }
    problems
}

#[test]
fn rbac_grants_ingest_exactly_what_the_kubernetes_source_uses_and_nobody_else_anything() {
    // The whole expected set: a grant added for a kind nobody watches, a missing one, a `get`
    // the source does not do, or a binding for another account all fail here.
    for build in builds() {
        let mut granted = grants_by_account(&build);
        let ingest = granted.remove("meshpilot-ingest").unwrap_or_default();
        let expected = expected_ingest_grants();
        let missing: Vec<String> = expected.difference(&ingest).map(show_grant).collect();
        let extra: Vec<String> = ingest.difference(&expected).map(show_grant).collect();
        assert!(
            missing.is_empty() && extra.is_empty(),
            "{}: meshpilot-ingest's grants differ from what the Kubernetes source uses\n  missing:\n    {}\n  extra:\n    {}",
            build.name,
            missing.join("\n    "),
            extra.join("\n    ")
        );
        let frontend = granted.remove("meshpilot-frontend").unwrap_or_default();
        assert_eq!(frontend, expected_frontend_grants(), "{}: meshpilot-frontend's grants", build.name);
        assert!(
            granted.is_empty(),
            "{}: only meshpilot-ingest and meshpilot-frontend may be granted anything: {granted:#?}",
            build.name
        );
    }
}

#[test]
fn ingest_runs_on_the_kubernetes_source_and_only_ingest_and_frontends_mount_an_api_token() {
    for build in builds() {
        let mut problems = Vec::new();
        let automount: BTreeMap<String, Option<bool>> = build
            .manifests
            .iter()
            .filter_map(|m| match &m.object {
                Object::ServiceAccount(sa) => {
                    Some((sa.metadata.name.clone().unwrap_or_default(), sa.automount_service_account_token))
                }
                _ => None,
            })
            .collect();
        let mut ingest_found = false;
        for w in workloads(&build.manifests) {
            let spec = w.template.spec.as_ref();
            let account = spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default();
            // The pod's setting wins over its ServiceAccount's; both unset means mounted.
            let pod = spec.and_then(|s| s.automount_service_account_token);
            let token = pod.or(automount.get(&account).copied().flatten()) != Some(false);
            let is_ingest = w.name == "meshpilot-ingest";
            // Frontends review proxies' tokens and read the CA's Secret (the secure port).
            let calls_api = is_ingest || w.name == "meshpilot-frontend";
            if token != calls_api {
                let why = if calls_api { "needs its token for the Kubernetes API" } else { "never calls the API" };
                problems.push(format!("{} {}: token mounted: {token}, but it {why}", w.kind, w.name));
            }
            if !is_ingest {
                continue;
            }
            ingest_found = true;
            let config_dir = build.generator(CONFIG_DIR_MAP).is_some();
            for c in w.containers().iter().filter(|c| is_meshpilot(c)) {
                problems.extend(ingest_source_problems(c, &build.namespace, config_dir));
            }
        }
        if !ingest_found {
            problems.push("no Deployment meshpilot-ingest".into());
        }
        // The mesh config is Istio's ConfigMap, found by name: no name hash.
        match build.generator(MESH_CONFIG_MAP) {
            Some(g) if g.entries().any(|(key, _)| key == MESH_KEY) && !g.hashed() => {}
            _ => problems
                .push(format!("no ConfigMap {MESH_CONFIG_MAP} with key {MESH_KEY} generated without a name hash")),
        }
        assert_no_problems(&format!("the Kubernetes source in {}", build.name), &problems);
    }
}

/// The ConfigMap the config-dir component mounts as `--config-dir`.
const CONFIG_DIR_MAP: &str = "meshpilot-istio-config";

/// The ingest container reads the cluster it runs in, in the namespace it runs in (where the
/// Role and the `istio` ConfigMap are), and a config directory exactly when the build ships one.
fn ingest_source_problems(c: &Container, namespace: &str, config_dir: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(cli) = parse_cli(c.args.as_deref().unwrap_or_default()) else {
        return problems; // reported by the command-line test
    };
    if cli.has("--config-dir") != config_dir {
        problems.push(format!(
            "container {}: --config-dir given: {}, but the build ships {CONFIG_DIR_MAP}: {config_dir}",
            c.name,
            cli.has("--config-dir")
        ));
    }
    if !cli.switches.contains("--kubernetes") {
        problems.push(format!("container {}: no --kubernetes (the in-cluster config)", c.name));
    }
    let from_env = c.env.iter().flatten().any(|e| {
        e.name == "POD_NAMESPACE"
            && e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str())
                == Some("metadata.namespace")
    });
    match cli.flags.get("--namespace") {
        Some(ns) if ns == namespace => {}
        Some(ns) => problems.push(format!("container {}: --namespace {ns}, but it runs in {namespace}", c.name)),
        None if from_env => {}
        None => problems.push(format!(
            "container {}: neither --namespace nor POD_NAMESPACE from metadata.namespace: it would look in istio-system",
            c.name
        )),
    }
    problems
}

#[test]
fn istio_crds_are_valid_v1_crds_for_the_ten_kinds() {
    let path = istio_crds_file();
    let mut problems = Vec::new();
    let mut kinds = BTreeSet::new();
    for (doc, value) in yaml_documents(&path) {
        let at = format!("{} document {doc}", shown(&path));
        let crd: CustomResourceDefinition = match typed(&value) {
            Ok(crd) => crd,
            Err(e) => {
                problems.push(format!("{at}: {e}"));
                continue;
            }
        };
        if value["apiVersion"] != "apiextensions.k8s.io/v1" || value["kind"] != "CustomResourceDefinition" {
            problems.push(format!("{at}: not an apiextensions.k8s.io/v1 CustomResourceDefinition"));
        }
        kinds.insert(crd.spec.names.kind.clone());
        problems.extend(crd_problems(&crd).into_iter().map(|p| format!("{at} ({}): {p}", crd.spec.names.kind)));
    }
    let expected: BTreeSet<String> = ISTIO_KINDS.iter().map(|k| k.kind.to_string()).collect();
    if kinds != expected {
        problems.push(format!("kinds {kinds:?}, expected exactly {expected:?}"));
    }
    assert_no_problems("Istio CRDs", &problems);
}

fn crd_problems(crd: &CustomResourceDefinition) -> Vec<String> {
    let spec = &crd.spec;
    let names = &spec.names;
    let Some(kind) = ISTIO_KINDS.iter().find(|k| k.kind == names.kind) else {
        return vec!["not a kind meshpilot watches".into()];
    };
    let mut problems = Vec::new();
    let got = (
        spec.group.as_str(),
        names.plural.as_str(),
        names.singular.clone(),
        names.list_kind.clone(),
        names.short_names.clone().unwrap_or_default(),
        spec.scope.as_str(),
        crd.metadata.name.clone(),
    );
    let want = (
        kind.group,
        kind.plural,
        Some(kind.kind.to_lowercase()),
        Some(format!("{}List", kind.kind)),
        kind.short_names.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        "Namespaced",
        Some(format!("{}.{}", kind.plural, kind.group)),
    );
    if got != want {
        problems.push(format!(
            "(group, plural, singular, listKind, shortNames, scope, metadata.name) {got:?}, expected {want:?}"
        ));
    }
    let versions: Vec<&str> = spec.versions.iter().map(|v| v.name.as_str()).collect();
    if versions != kind.versions() {
        problems.push(format!("versions {versions:?}, expected {:?} (those Istio serves)", kind.versions()));
    }
    let stored: Vec<&str> = spec.versions.iter().filter(|v| v.storage).map(|v| v.name.as_str()).collect();
    if stored != ["v1"] {
        problems.push(format!("stored versions {stored:?}: exactly one, v1"));
    }
    for v in &spec.versions {
        if !v.served {
            problems.push(format!("{}: not served", v.name));
        }
        if v.subresources.as_ref().and_then(|s| s.status.as_ref()).is_none() {
            problems.push(format!("{}: no status subresource", v.name));
        }
        let schema = v.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref());
        let open_object = |field: &str| {
            schema.and_then(|s| s.properties.as_ref()).and_then(|p| p.get(field)).is_some_and(|p| {
                p.type_.as_deref() == Some("object") && p.x_kubernetes_preserve_unknown_fields == Some(true)
            })
        };
        if schema.and_then(|s| s.type_.as_deref()) != Some("object") || !open_object("spec") || !open_object("status") {
            problems.push(format!(
                "{}: the schema must be an object whose spec and status are objects preserving unknown fields",
                v.name
            ));
        }
    }
    problems
}

#[test]
fn pods_meet_the_restricted_pod_security_standard_and_are_probed_and_sized() {
    let mut problems = Vec::new();
    for build in builds() {
        for w in workloads(&build.manifests) {
            let at = format!("{}: {} ({} {})", build.name, w.at, w.kind, w.name);
            problems.extend(pod_problems(&w).into_iter().map(|p| format!("{at}: {p}")));
        }
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

#[test]
fn the_validating_webhook_calls_every_ingest_node_on_15017_with_istiods_rules() {
    for build in builds() {
        let problems = webhook_problems(&build);
        assert_no_problems(&format!("the validating webhook of {}", build.name), &problems);
    }
}

fn webhook_problems(build: &Build) -> Vec<String> {
    let mut problems = Vec::new();
    let configs: Vec<_> = build
        .manifests
        .iter()
        .filter_map(|m| match &m.object {
            Object::ValidatingWebhook(c) => Some((m.at(), c)),
            _ => None,
        })
        .collect();
    let names: Vec<_> = configs.iter().map(|(_, c)| c.metadata.name.clone().unwrap_or_default()).collect();
    if names != [WEBHOOK_CONFIG] {
        problems.push(format!("ValidatingWebhookConfigurations {names:?}, expected [{WEBHOOK_CONFIG:?}]"));
    }
    let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<BTreeSet<String>>();
    for (at, config) in &configs {
        let webhooks = config.webhooks.as_deref().unwrap_or_default();
        if webhooks.is_empty() {
            problems.push(format!("{at}: no webhooks"));
        }
        for w in webhooks {
            let at = format!("{at}: webhook {}", w.name);
            let service = w.client_config.service.as_ref();
            let target = service.map(|s| (s.name.as_str(), s.namespace.as_str(), s.port, s.path.as_deref()));
            let expected = (WEBHOOK_SERVICE, build.namespace.as_str(), Some(WEBHOOK_PORT), Some("/validate"));
            if target != Some(expected) || w.client_config.url.is_some() {
                problems.push(format!("{at}: calls {target:?}, expected the Service {expected:?}"));
            }
            // The ingest leader sets it from the CA; one in the manifest would be stale.
            if w.client_config.ca_bundle.is_some() {
                problems.push(format!("{at}: a caBundle in the manifest"));
            }
            if w.failure_policy.as_deref() != Some("Fail") || w.side_effects != "None" {
                problems.push(format!("{at}: failurePolicy {:?}, sideEffects {:?}", w.failure_policy, w.side_effects));
            }
            if w.admission_review_versions != ["v1"] {
                problems.push(format!("{at}: admissionReviewVersions {:?}", w.admission_review_versions));
            }
            let rules: Vec<_> = w
                .rules
                .iter()
                .flatten()
                .map(|r| {
                    let field = |v: &Option<Vec<String>>| v.iter().flatten().cloned().collect::<BTreeSet<String>>();
                    let operations = field(&r.operations);
                    (field(&r.api_groups), field(&r.api_versions), operations, field(&r.resources))
                })
                .collect();
            let istiods = (
                set(&["networking.istio.io", "security.istio.io"]),
                set(&["*"]),
                set(&["CREATE", "UPDATE"]),
                set(&["*"]),
            );
            if rules != [istiods.clone()] {
                problems.push(format!("{at}: rules {rules:?}, expected istiod's {istiods:?}"));
            }
        }
    }
    // The Service: not headless (the API server dials its cluster IP), port 15017 on ingest pods.
    let service = build.manifests.iter().find_map(|m| match &m.object {
        Object::Service(s) if s.metadata.name.as_deref() == Some(WEBHOOK_SERVICE) => Some(s),
        _ => None,
    });
    match service.and_then(|s| s.spec.as_ref()) {
        None => problems.push(format!("no Service {WEBHOOK_SERVICE}")),
        Some(spec) => {
            if spec.cluster_ip.as_deref() == Some("None") {
                problems.push(format!("Service {WEBHOOK_SERVICE} is headless"));
            }
            if !spec.ports.iter().flatten().any(|p| p.port == WEBHOOK_PORT) {
                problems.push(format!("Service {WEBHOOK_SERVICE} has no port {WEBHOOK_PORT}"));
            }
            let selector = LabelSelector { match_labels: spec.selector.clone(), ..Default::default() };
            let selected_ingest = workloads(&build.manifests)
                .iter()
                .any(|w| w.name == "meshpilot-ingest" && selects(&selector, &w.labels()) == Ok(true));
            if !selected_ingest {
                problems.push(format!("Service {WEBHOOK_SERVICE} does not select the ingest pods"));
            }
        }
    }
    // Every ingest node serves it, under the names the configuration and the Service use.
    for w in workloads(&build.manifests).iter().filter(|w| w.name == "meshpilot-ingest") {
        for c in w.containers().iter().filter(|c| is_meshpilot(c)) {
            let Ok(cli) = parse_cli(c.args.as_deref().unwrap_or_default()) else { continue };
            let flag = |name: &str| cli.flags.get(name).map(String::as_str);
            if flag("--webhook-addr") != Some("0.0.0.0:15017") {
                problems.push(format!("{}: --webhook-addr {:?}, expected 0.0.0.0:15017", w.at, flag("--webhook-addr")));
            }
            for (name, value) in [("--webhook-service", WEBHOOK_SERVICE), ("--webhook-config-name", WEBHOOK_CONFIG)] {
                if flag(name).is_some_and(|v| v != value) {
                    problems.push(format!("{}: {name} {:?}, but the manifests use {value:?}", w.at, flag(name)));
                }
            }
            if !container_ports(c).iter().any(|(_, p)| *p == WEBHOOK_PORT) {
                problems.push(format!("{}: no container port {WEBHOOK_PORT}", w.at));
            }
        }
    }
    problems
}

/// The Secrets `deploy/etcd-certs.sh` makes: etcd's serving certificate, and the client one.
const ETCD_SERVER_SECRET: &str = "meshpilot-etcd-server-tls";
const ETCD_CLIENT_SECRET: &str = "meshpilot-etcd-client-tls";
/// Keys of both (`kubernetes.io/tls`, plus the CA).
const ETCD_SECRET_KEYS: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

#[test]
fn etcd_requires_client_certificates_and_meshpilot_reaches_it_only_over_tls() {
    // Whoever can write etcd chooses the leader frontends follow (issue 27, finding 3).
    let mut problems = Vec::new();
    let mut etcd_seen = false;
    for build in builds() {
        for w in workloads(&build.manifests) {
            for c in w.containers() {
                let at = format!("{}: {} ({} {}, container {})", build.name, w.at, w.kind, w.name, c.name);
                let args = c.args.as_deref().unwrap_or_default();
                let problems_here = if c.name == "etcd" {
                    etcd_seen = true;
                    etcd_tls_problems(&w, c, args)
                } else if is_meshpilot(c) {
                    // parse_cli demands https:// endpoints and the three files: here, where from.
                    let files = ["--etcd-cacert", "--etcd-cert", "--etcd-key"].map(|f| flag_value(args, f));
                    secret_file_problems(&w, c, files.iter().flatten().map(String::as_str), ETCD_CLIENT_SECRET)
                } else {
                    Vec::new()
                };
                problems.extend(problems_here.into_iter().map(|p| format!("{at}: {p}")));
                // Only etcd holds its serving key.
                let mounts_server = w
                    .volumes()
                    .iter()
                    .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(ETCD_SERVER_SECRET));
                if mounts_server && c.name != "etcd" {
                    problems.push(format!("{at}: mounts etcd's serving key ({ETCD_SERVER_SECRET})"));
                }
            }
        }
    }
    assert!(etcd_seen, "no etcd container in the manifests");
    // No file of deploy/ names etcd's client or peer port over plaintext.
    for file in files_under(&repo().join("deploy"), Path::new("")) {
        let text = read(&repo().join("deploy").join(&file));
        for (n, line) in text.lines().enumerate() {
            for url in line.split("http://").skip(1) {
                let host_port: String = url.chars().take_while(|c| !"/ ,\"'".contains(*c)).collect();
                if host_port.contains("etcd") || host_port.ends_with(":2379") || host_port.ends_with(":2380") {
                    problems.push(format!("deploy/{file}:{}: plaintext etcd URL http://{host_port}", n + 1));
                }
            }
        }
    }
    assert_no_problems("etcd access", &problems);
}

/// The value of `--flag=VALUE` or `--flag VALUE` among `args`.
fn flag_value(args: &[String], flag: &str) -> Option<String> {
    let prefix = format!("{flag}=");
    args.iter().enumerate().find_map(|(i, a)| match a.strip_prefix(&prefix) {
        Some(v) => Some(v.to_string()),
        None if a == flag => args.get(i + 1).cloned(),
        None => None,
    })
}

/// etcd's own flags: TLS with client certificates on the client and the peer port (3 members).
fn etcd_tls_problems(w: &Workload, c: &Container, args: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    for switch in ["--client-cert-auth", "--peer-client-cert-auth"] {
        if !args.iter().any(|a| a == switch || a == &format!("{switch}=true")) {
            problems.push(format!("etcd runs without {switch}"));
        }
    }
    let mut files = Vec::new();
    for flag in ["--cert-file", "--key-file", "--trusted-ca-file"] {
        for flag in [flag.to_string(), flag.replacen("--", "--peer-", 1)] {
            match flag_value(args, &flag) {
                Some(file) => files.push(file),
                None => problems.push(format!("etcd runs without {flag}")),
            }
        }
    }
    for flag in
        ["--listen-client-urls", "--advertise-client-urls", "--listen-peer-urls", "--initial-advertise-peer-urls"]
    {
        let urls = flag_value(args, flag).unwrap_or_default();
        if urls.is_empty() || urls.split(',').any(|u| !u.starts_with("https://")) {
            problems.push(format!("{flag} {urls:?}: not all https://"));
        }
    }
    let cluster = flag_value(args, "--initial-cluster").unwrap_or_default();
    if cluster.split(',').any(|m| !m.split_once('=').is_some_and(|(_, url)| url.starts_with("https://"))) {
        problems.push(format!("--initial-cluster {cluster:?}: peers not all https://"));
    }
    problems.extend(secret_file_problems(w, c, files.iter().map(String::as_str), ETCD_SERVER_SECRET));
    problems
}

/// Each of `files` must be a key of Secret `secret`, mounted read-only in `c`.
fn secret_file_problems<'a>(
    w: &Workload,
    c: &Container,
    files: impl Iterator<Item = &'a str>,
    secret: &str,
) -> Vec<String> {
    let volumes: BTreeSet<&str> = w
        .volumes()
        .iter()
        .filter(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret))
        .map(|v| v.name.as_str())
        .collect();
    let mounts: Vec<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| volumes.contains(m.name.as_str()) && m.read_only == Some(true) && m.sub_path.is_none())
        .map(|m| m.mount_path.trim_end_matches('/'))
        .collect();
    let mut problems = Vec::new();
    let mut count = 0;
    for file in files {
        count += 1;
        let from_secret = mounts
            .iter()
            .any(|m| file.strip_prefix(&format!("{m}/")).is_some_and(|key| ETCD_SECRET_KEYS.contains(&key)));
        if !from_secret {
            problems.push(format!("{file} is no key of Secret {secret} mounted read-only ({mounts:?})"));
        }
    }
    if count == 0 {
        problems.push(format!("names no file of Secret {secret}"));
    }
    problems
}

#[test]
fn etcd_certs_sh_makes_the_secrets_the_manifests_mount() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let out = dir.path().join("pki");
    let namespace = load_base().namespace;
    let status = std::process::Command::new("bash")
        .arg(repo().join("deploy/etcd-certs.sh"))
        .arg(&out)
        .arg(&namespace)
        .status()
        .expect("bash runs");
    assert!(status.success(), "deploy/etcd-certs.sh failed: {status}");
    let ca_key = std::fs::read(out.join("ca.key")).expect("the CA key");
    let mut names = BTreeSet::new();
    for (doc, value) in yaml_documents(&out.join("etcd-tls-secrets.yaml")) {
        let secret: k8s_openapi::api::core::v1::Secret =
            typed(&value).unwrap_or_else(|e| panic!("document {doc} is no Secret: {e}"));
        let name = secret.metadata.name.clone().unwrap_or_default();
        assert_eq!(secret.metadata.namespace.as_deref(), Some(namespace.as_str()), "{name}");
        assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"), "{name}");
        let data = secret.data.unwrap_or_default();
        assert_eq!(data.keys().map(String::as_str).collect::<Vec<_>>(), ETCD_SECRET_KEYS, "{name}");
        for (key, value) in &data {
            let text = String::from_utf8_lossy(&value.0);
            assert!(text.starts_with("-----BEGIN "), "{name} {key} is not PEM");
            assert!(value.0 != ca_key, "{name} {key} carries the CA's key");
        }
        names.insert(name);
    }
    assert_eq!(names, BTreeSet::from([ETCD_CLIENT_SECRET.to_string(), ETCD_SERVER_SECRET.to_string()]));
}
