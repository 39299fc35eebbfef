//! The inputs of one comparison, and the corpora they come from: the project's examples, the
//! hand-made cases of `tests/testdata/differential/`, and Istio's own inputs read at run time from
//! the istio.io/istio module in the Go module cache (never copied into the project).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use super::proxies::{default_set, ProxyDef};
use super::template;

/// The Istio kinds both servers read from a config dir (meshpilot's `config::Kind::ALL`).
const ISTIO_KINDS: [&str; 9] = [
    "VirtualService",
    "DestinationRule",
    "Gateway",
    "ServiceEntry",
    "WorkloadEntry",
    "Sidecar",
    "AuthorizationPolicy",
    "RequestAuthentication",
    "PeerAuthentication",
];
/// Kubernetes kinds applied to the API server both watch.
const KUBE_KINDS: [&str; 6] = ["Namespace", "Service", "Endpoints", "EndpointSlice", "Pod", "Secret"];

/// One case: what both servers get, and the proxies that ask them.
#[derive(Debug, Clone)]
pub struct Case {
    /// `corpus/name`, unique.
    pub name: String,
    /// Which corpus it is from.
    pub corpus: String,
    /// Istio documents, written to the config dir both read.
    pub config: Vec<Value>,
    /// Kubernetes objects, applied to the API server both watch.
    pub kube: Vec<Value>,
    /// The MeshConfig both get (None: the judge's default).
    pub mesh: Option<PathBuf>,
    /// The proxies connected to both.
    pub proxies: Vec<ProxyDef>,
    /// What of the inputs was left out, and why.
    pub skipped: Vec<String>,
}

impl Case {
    /// A case from YAML `texts`; Istio documents lacking a namespace get `default`, as `kubectl
    /// apply` gives them (istiod's config dir and meshpilot's would otherwise differ on a detail
    /// no cluster shows).
    pub fn from_texts(corpus: &str, name: &str, texts: &[String], mesh: Option<PathBuf>) -> Case {
        let mut case = Case {
            name: format!("{corpus}/{name}"),
            corpus: corpus.to_string(),
            config: Vec::new(),
            kube: Vec::new(),
            mesh,
            proxies: Vec::new(),
            skipped: Vec::new(),
        };
        for (i, doc) in texts.iter().flat_map(|t| documents(t)).enumerate() {
            let mut value: Value = match serde_saphyr::from_str(&doc) {
                Ok(v) => v,
                Err(e) => {
                    let first = e.to_string().lines().next().unwrap_or_default().to_string();
                    case.skipped.push(format!("document {} does not parse: {first}", i + 1));
                    continue;
                }
            };
            let kind = value["kind"].as_str().unwrap_or("?").to_string();
            let group = value["apiVersion"].as_str().unwrap_or("").split('/').next().unwrap_or("").to_string();
            let istio = ISTIO_KINDS.contains(&kind.as_str()) && group.ends_with(".istio.io");
            let kube = KUBE_KINDS.contains(&kind.as_str()) && matches!(group.as_str(), "v1" | "discovery.k8s.io");
            if !istio && !kube {
                case.skipped.push(format!("{kind} {}: {}", value["metadata"]["name"], skip_reason(&group, &kind)));
                continue;
            }
            if kind != "Namespace" && value["metadata"]["namespace"].is_null() {
                value["metadata"]["namespace"] = Value::from("default");
            }
            if istio {
                case.config.push(value)
            } else {
                case.kube.push(value)
            }
        }
        case.proxies = default_set(&case.config, &case.kube);
        case
    }

    /// The namespaces the case's objects and proxies live in (each gets a Namespace object).
    pub fn namespaces(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .config
            .iter()
            .chain(&self.kube)
            .filter_map(|d| d["metadata"]["namespace"].as_str().map(String::from))
            .chain(self.proxies.iter().map(|p| p.namespace.clone()))
            .chain(["istio-system".to_string()])
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

fn skip_reason(group: &str, kind: &str) -> &'static str {
    match (group, kind) {
        ("gateway.networking.k8s.io", _) => "Gateway API is off on both servers",
        (_, "EnvoyFilter" | "Telemetry" | "WasmPlugin" | "ProxyConfig" | "WorkloadGroup") => {
            "a kind meshpilot does not read"
        }
        (_, "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet") => {
            "no controllers run on the test API server (Pods are given directly)"
        }
        _ => "a kind neither server reads from these inputs",
    }
}

/// The YAML documents of `text` (split on `---` lines; comment-only documents dropped).
pub fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(d) = docs.last_mut() {
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.retain(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')));
    docs
}

fn repo() -> PathBuf {
    crate::common::deploy::repo()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// The project's examples: bookinfo with the example's MeshConfig.
pub fn examples() -> Vec<Case> {
    let dir = repo().join("examples/bookinfo");
    let texts: Vec<String> = yaml_files(&dir).iter().map(|p| read(p)).collect();
    vec![Case::from_texts("examples", "bookinfo", &texts, Some(repo().join("examples/mesh.yaml")))]
}

/// Where the hand-made cases live.
pub fn hand_made_dir() -> PathBuf {
    repo().join("tests/testdata/differential")
}

/// The hand-made cases: each directory of `tests/testdata/differential/` is one; its YAML files
/// are the inputs except `proxies.yaml` (the proxy set, replacing the derived one) and
/// `mesh.yaml` (the MeshConfig).
pub fn hand_made() -> Vec<Case> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(hand_made_dir())
        .expect("listing tests/testdata/differential")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|dir| {
            let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let files = yaml_files(dir);
            let is = |p: &PathBuf, n: &str| p.file_name().is_some_and(|f| f == n);
            let texts: Vec<String> =
                files.iter().filter(|p| !is(p, "proxies.yaml") && !is(p, "mesh.yaml")).map(|p| read(p)).collect();
            let mesh = files.iter().find(|p| is(p, "mesh.yaml")).cloned();
            let mut case = Case::from_texts("hand-made", &name, &texts, mesh);
            if let Some(p) = files.iter().find(|p| is(p, "proxies.yaml")) {
                case.proxies = serde_saphyr::from_str(&read(p))
                    .unwrap_or_else(|e| panic!("{}: not a list of proxies: {e}", p.display()));
            }
            case
        })
        .collect()
}

/// The istio.io/istio module of `scripts/istio-version` in the Go module cache
/// (`$MESHPILOT_ISTIO_MODULE` overrides), or None where it is not there.
pub fn istio_module() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MESHPILOT_ISTIO_MODULE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let version = std::fs::read_to_string(repo().join("scripts/istio-version")).ok()?;
    let out = Command::new("go").args(["env", "GOMODCACHE"]).output().ok()?;
    let cache = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let dir = Path::new(&cache).join(format!("istio.io/istio@{}", version.trim()));
    dir.is_dir().then_some(dir)
}

/// Istio's own inputs: `tests/testdata/config/*.yaml` (corpus `istio-config`) and
/// `pilot/pkg/xds/testdata/benchmarks/*.yaml` (corpus `istio-benchmarks`, Go templates rendered
/// with small parameters). A file that cannot be used becomes a case with no inputs and the
/// reason in `skipped`.
pub fn istio(module: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    for (corpus, sub) in
        [("istio-config", "tests/testdata/config"), ("istio-benchmarks", "pilot/pkg/xds/testdata/benchmarks")]
    {
        for file in yaml_files(&module.join(sub)) {
            let name = file.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let text = read(&file);
            let rendered =
                if text.contains("{{") { template::render(&text, &template::parameters()) } else { Ok(text) };
            match rendered {
                Ok(text) => cases.push(Case::from_texts(corpus, &name, &[text], None)),
                Err(why) => {
                    let mut case = Case::from_texts(corpus, &name, &[], None);
                    case.skipped.push(format!("the whole file: its template uses {why}"));
                    case.proxies.clear();
                    cases.push(case);
                }
            }
        }
    }
    cases.extend(istio_authz(module));
    cases
}

/// The workload the AuthorizationPolicy inputs of Istio's authz builder select: `httpbin` v1 in
/// namespace `foo`, with an HTTP and a TCP port, as a Service, its Pod and its EndpointSlice.
const AUTHZ_WORKLOAD: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: httpbin, namespace: foo}\nspec:\n  \
clusterIP: 10.96.50.1\n  selector: {app: httpbin}\n  ports:\n  - {name: http, port: 8000, targetPort: 8000}\n  \
- {name: tcp, port: 9000, targetPort: 9000}\n---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: httpbin-v1\n  \
namespace: foo\n  labels: {app: httpbin, version: v1}\nspec:\n  serviceAccountName: default\n  containers: \
[{name: app, image: app, ports: [{containerPort: 8000}, {containerPort: 9000}]}]\nstatus:\n  phase: Running\n  \
podIP: 10.1.50.10\n  podIPs: [{ip: 10.1.50.10}]\n  conditions: [{type: Ready, status: \"True\"}]\n---\n\
apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: httpbin-slice\n  namespace: foo\n  \
labels: {kubernetes.io/service-name: httpbin}\naddressType: IPv4\nports: [{name: http, port: 8000, protocol: TCP}, \
{name: tcp, port: 9000, protocol: TCP}]\nendpoints:\n- addresses: [10.1.50.10]\n  conditions: {ready: true, \
serving: true, terminating: false}\n  targetRef: {kind: Pod, name: httpbin-v1, namespace: foo}\n";

/// The AuthorizationPolicy inputs of Istio's authz builder (`*-in.yaml` of its HTTP and TCP
/// testdata), each applied to the workload they select.
fn istio_authz(module: &Path) -> Vec<Case> {
    let mut cases = Vec::new();
    for sub in ["http", "tcp"] {
        let dir = module.join("pilot/pkg/security/authz/builder/testdata").join(sub);
        for file in yaml_files(&dir).into_iter().filter(|f| f.to_string_lossy().ends_with("-in.yaml")) {
            let stem = file.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let name = format!("{sub}-{}", stem.trim_end_matches("-in"));
            cases.push(Case::from_texts("istio-authz", &name, &[read(&file), AUTHZ_WORKLOAD.to_string()], None));
        }
    }
    cases
}
