//! A real Kubernetes API server for tests: kube-apiserver (built from the Go module proxy by
//! `scripts/kube-apiserver.sh`) on a real etcd, 127.0.0.1, ports chosen at run time, TLS from a
//! CA the test makes, bearer tokens from a token file. No controllers run: tests write Pods'
//! status and EndpointSlices themselves, as the kubelet and the EndpointSlice controller would.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::{ApiCapabilities, ApiResource, Discovery, Scope};
use kube::{Api, Client, Config};
use serde_json::Value;

use super::etcd::{Etcd, EtcdEndpoint};
use super::poll::{poll, STARTUP_TIMEOUT};
use super::ports::free_port;
use super::process::{deref_to_process, temp_dir, Process, ProcessSpec};

/// The token of the cluster admin (group `system:masters`).
pub const ADMIN_TOKEN: &str = "meshpilot-test-admin-token";
/// The token of user `meshpilot`, who has only the RBAC rules a test grants.
pub const MESHPILOT_TOKEN: &str = "meshpilot-test-reader-token";

/// The kube-apiserver binary: `$MESHPILOT_KUBE_APISERVER`, else what `scripts/kube-apiserver.sh`
/// built. `None` (the test skips, saying why) where neither exists, except in CI, where a test
/// that cannot run is a failure.
pub fn apiserver_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MESHPILOT_KUBE_APISERVER").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "MESHPILOT_KUBE_APISERVER={} does not exist", p.display());
        return Some(p);
    }
    let out = Command::new("bash").arg(repo_path("scripts/kube-apiserver.sh")).output();
    if let Ok(out) = out {
        let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && p.is_file() {
            return Some(p);
        }
    }
    let why = "kube-apiserver is not available: `bash scripts/kube-apiserver.sh` builds it where Go exists";
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why} (CI=true: this test must run)");
    eprintln!("SKIPPED: {why}");
    None
}

fn repo_path(rel: &str) -> PathBuf {
    super::deploy::repo().join(rel)
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").args(args).current_dir(dir).output().expect("running openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A running kube-apiserver with its etcd; derefs to the apiserver [`Process`].
pub struct KubeApi {
    process: Process,
    etcd: Etcd,
    port: u16,
    ca: PathBuf,
}

deref_to_process!(KubeApi);

impl KubeApi {
    /// Starts etcd and kube-apiserver, waits until it serves, and installs the Istio CRDs of
    /// `deploy/crds/`. `None` when the binary is missing (outside CI).
    pub async fn start() -> Option<KubeApi> {
        let binary = apiserver_binary()?;
        let etcd = Etcd::start().await;
        let dir = temp_dir("meshpilot-kube-");
        let d = dir.path();
        // A CA, the server's certificate for 127.0.0.1, and the service-account signing key.
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=meshpilot-test-ca",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=kube-apiserver",
            ],
        );
        std::fs::write(d.join("san.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n").expect("writing san.ext");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        std::fs::write(
            d.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin,system:masters\n{MESHPILOT_TOKEN},meshpilot,meshpilot\n"),
        )
        .expect("writing tokens.csv");
        let ca = d.join("ca.crt");
        let port = free_port();
        let path = |f: &str| d.join(f).display().to_string();
        let store = etcd.endpoint();
        let spec = ProcessSpec::new("kube-apiserver", binary)
            .args(["--etcd-servers".to_string(), store.url.clone()])
            // The test etcd requires a client certificate (TLS by default, as deployed).
            .args(etcd_file_flag("--etcd-cafile", &store.tls.ca))
            .args(etcd_file_flag("--etcd-certfile", &store.tls.cert))
            .args(etcd_file_flag("--etcd-keyfile", &store.tls.key))
            .args(["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"])
            .args(["--secure-port".to_string(), port.to_string()])
            .args([
                "--tls-cert-file".to_string(),
                path("server.crt"),
                "--tls-private-key-file".into(),
                path("server.key"),
            ])
            .args(["--token-auth-file".to_string(), path("tokens.csv")])
            .args(["--authorization-mode", "RBAC"])
            .args(["--service-account-issuer", "https://kubernetes.default.svc.cluster.local"])
            .args(["--service-account-key-file".to_string(), path("sa.pub")])
            .args(["--service-account-signing-key-file".to_string(), path("sa.key")])
            .args(["--service-cluster-ip-range", "10.96.0.0/16"])
            // No controllers run here: nothing would create the `default` service account pods need.
            .args(["--disable-admission-plugins", "ServiceAccount"])
            .args(["--enable-priority-and-fairness=false", "--profiling=false"])
            .log_tail(80, 40);
        let api = KubeApi { process: Process::start(dir, spec), etcd, port, ca };
        api.wait_serving().await;
        api.install_crds().await;
        api.wait_bootstrapped().await;
        Some(api)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The etcd the API server stores in (meshpilot's election can share it: other keys).
    pub fn etcd_endpoint(&self) -> EtcdEndpoint {
        self.etcd.endpoint()
    }

    /// The API server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A kubeconfig for `server` with `token` (and the test CA for an https server), written to
    /// `dir/name`.
    pub fn write_kubeconfig(&self, dir: &Path, name: &str, server: &str, token: &str) -> PathBuf {
        let ca_line = match server.starts_with("https://") {
            true => format!("    certificate-authority: {}\n", self.ca.display()),
            false => String::new(),
        };
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n{ca_line}users:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: user}}\ncurrent-context: test\n"
        );
        let path = dir.join(name);
        std::fs::write(&path, text).expect("writing kubeconfig");
        path
    }

    /// A client acting as the cluster admin.
    pub async fn admin(&self) -> Client {
        let dir = self.process.dir().to_path_buf();
        let file = self.write_kubeconfig(&dir, "admin.kubeconfig", &self.url(), ADMIN_TOKEN);
        let kc = Kubeconfig::read_from(&file).expect("reading the admin kubeconfig");
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.expect("admin config");
        Client::try_from(config).expect("admin client")
    }

    /// Restarts the API server on the same port (etcd keeps the data) and waits until it serves.
    pub async fn restart(&mut self) {
        self.process.restart();
        self.wait_serving().await;
    }

    async fn wait_serving(&self) {
        let client = self.admin().await;
        self.process
            .poll_while_running(STARTUP_TIMEOUT, async || {
                matches!(tokio::time::timeout(Duration::from_secs(3), client.apiserver_version()).await, Ok(Ok(_)))
            })
            .await;
    }

    /// Waits for what the API server creates itself after start (the `default/kubernetes`
    /// Service), so that it does not land in the middle of a test as a change of its own.
    async fn wait_bootstrapped(&self) {
        let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(self.admin().await, "default");
        let created = poll(STARTUP_TIMEOUT, async || services.get("kubernetes").await.is_ok()).await;
        assert!(created, "the API server did not create the default/kubernetes Service");
    }

    async fn install_crds(&self) {
        let client = self.admin().await;
        let text = std::fs::read_to_string(repo_path("deploy/crds/istio-crds.yaml"))
            .expect("reading deploy/crds/istio-crds.yaml");
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        let mut names = Vec::new();
        for doc in text.split("\n---").filter(|d| d.contains("kind: CustomResourceDefinition")) {
            let crd: CustomResourceDefinition = serde_saphyr::from_str(doc).expect("parsing a CRD");
            let name = crd.metadata.name.clone().expect("a CRD name");
            api.patch(&name, &PatchParams::apply("meshpilot-tests").force(), &Patch::Apply(&crd))
                .await
                .expect("applying a CRD");
            names.push(name);
        }
        // Established CRDs are served (and in discovery) only after a moment.
        let established = poll(STARTUP_TIMEOUT, async || {
            for name in &names {
                let Ok(crd) = api.get(name).await else { return false };
                let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
                if !conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") {
                    return false;
                }
            }
            true
        })
        .await;
        assert!(established, "the Istio CRDs were not established within {STARTUP_TIMEOUT:?}");
    }
}

/// A token for service account `sa` in `ns` from the TokenRequest API, for the audience
/// pilot-agent's tokens are for (`istio-ca`): what an injected pod has mounted.
pub async fn istio_token(client: &Client, ns: &str, sa: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["istio-ca".into()],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = api.create_token_request(sa, &kube::api::PostParams::default(), &request).await.expect("a token");
    answer.status.expect("a token status").token
}

/// Applies Kubernetes YAML (one or more documents) as the admin, with server-side apply, as
/// `kubectl apply --server-side` does; `status` fields are written through the status subresource.
pub async fn apply(client: &Client, yaml: &str) {
    let docs =
        yaml.split("\n---").filter(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')));
    let mut objects = Vec::new();
    for doc in docs {
        let value: Value = serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("test YAML: {e}\n{doc}"));
        let obj: DynamicObject = serde_json::from_value(value.clone()).expect("a Kubernetes object");
        objects.push((value, obj));
    }
    let kinds: Vec<_> =
        objects.iter().filter_map(|(_, o)| o.types.as_ref()).map(|t| gvk(&t.api_version, &t.kind)).collect();
    let discovery = discover(client, &kinds).await;
    for (value, obj) in objects {
        let (resource, caps) = resolve(&discovery, &obj);
        let api = api_for(client, &resource, &caps, obj.metadata.namespace.as_deref());
        let name = obj.metadata.name.clone().expect("metadata.name");
        let params = PatchParams::apply("meshpilot-tests").force();
        api.patch(&name, &params, &Patch::Apply(&value)).await.unwrap_or_else(|e| panic!("applying {name}: {e}"));
        if value.get("status").is_some() {
            api.patch_status(&name, &params, &Patch::Apply(&value))
                .await
                .unwrap_or_else(|e| panic!("status of {name}: {e}"));
        }
    }
}

/// Deletes an object by `apiVersion`, kind, namespace and name.
pub async fn delete(client: &Client, api_version: &str, kind: &str, namespace: Option<&str>, name: &str) {
    let discovery = discover(client, &[gvk(api_version, kind)]).await;
    let mut obj = DynamicObject::new(name, &ApiResource::from_gvk(&gvk(api_version, kind)));
    obj.metadata.namespace = namespace.map(String::from);
    let (resource, caps) = resolve(&discovery, &obj);
    let api = api_for(client, &resource, &caps, namespace);
    api.delete(name, &DeleteParams::default()).await.unwrap_or_else(|e| panic!("deleting {kind} {name}: {e}"));
}

fn gvk(api_version: &str, kind: &str) -> kube::api::GroupVersionKind {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    kube::api::GroupVersionKind::gvk(group, version, kind)
}

/// Discovery that serves every kind in `objects` (CRDs reappear in discovery only a moment
/// after an API server restart).
async fn discover(client: &Client, kinds: &[kube::api::GroupVersionKind]) -> Discovery {
    let mut last = None;
    let found = poll(STARTUP_TIMEOUT, async || {
        let Ok(d) = Discovery::new(client.clone()).run().await else { return false };
        let complete = kinds.iter().all(|k| d.resolve_gvk(k).is_some());
        last = Some(d);
        complete
    })
    .await;
    match last {
        Some(d) if found => d,
        _ => panic!("the API server does not serve all of {kinds:?}"),
    }
}

fn resolve(discovery: &Discovery, obj: &DynamicObject) -> (ApiResource, ApiCapabilities) {
    let types = obj.types.as_ref().expect("apiVersion and kind");
    discovery
        .resolve_gvk(&gvk(&types.api_version, &types.kind))
        .unwrap_or_else(|| panic!("the API server does not serve {} {}", types.api_version, types.kind))
}

fn api_for(client: &Client, resource: &ApiResource, caps: &ApiCapabilities, ns: Option<&str>) -> Api<DynamicObject> {
    match (&caps.scope, ns) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), resource),
        (Scope::Cluster, _) => Api::all_with(client.clone(), resource),
    }
}

/// A plain-HTTP front for the API server, as local test clusters (and `kubectl proxy`) offer:
/// each connection is relayed, bytes unchanged, over TLS to the real server, so the bearer token
/// a client sends is still checked by the API server. Stops when dropped.
pub struct PlainHttpFront {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl PlainHttpFront {
    /// Listens on 127.0.0.1 and relays to `api`.
    pub async fn start(api: &KubeApi) -> PlainHttpFront {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, ServerName};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&api.ca).expect("reading the test CA") {
            roots.add(cert.expect("a CA certificate")).expect("adding the test CA");
        }
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(tls));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", free_port())).await.expect("binding the front");
        let port = listener.local_addr().expect("front address").port();
        let upstream = api.port;
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let connector = connector.clone();
                tokio::spawn(async move {
                    let Ok(tcp) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await else { return };
                    let name = ServerName::try_from("127.0.0.1").expect("a server name");
                    let Ok(mut server) = connector.connect(name.to_owned(), tcp).await else { return };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
        PlainHttpFront { port, task }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for PlainHttpFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `[flag, file]` when `file` is set (an etcd TLS file), else nothing.
fn etcd_file_flag(flag: &str, file: &Option<PathBuf>) -> Vec<String> {
    file.iter().flat_map(|f| [flag.to_string(), f.display().to_string()]).collect()
}
