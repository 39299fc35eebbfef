//! Istio's validating webhook as the API server uses it: AdmissionReviews posted over HTTPS to
//! `meshpilot standalone --webhook-addr`, trusting meshpilot's CA, are allowed or denied with
//! istiod's messages (Istio's validation corpus among them); and with a real kube-apiserver,
//! meshpilot sets the caBundle of a ValidatingWebhookConfiguration that has none, after which
//! the API server refuses an invalid VirtualService with the webhook's message; in a split
//! deployment every ingest node serves the webhook and only the leader keeps the caBundle.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use common::corpus::{corpus_dir, documents, ERROR_KEY};
use common::kube::{apply, KubeApi, ADMIN_TOKEN};
use common::meshpilot::{wait_leader, Meshpilot};
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::ports::free_addr;
use common::process::temp_dir;
use common::webhook::{admission_review, virtual_service as valid_virtual_service, WebhookClient};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use kube::Api;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{json, Value};

/// The webhook configuration the kube test creates.
const CONFIG_NAME: &str = "meshpilot-validator-test";

/// An HTTPS client of the webhook trusting `roots` (HTTP/1.1, as the API server talks to it).
struct Client {
    addr: SocketAddr,
    tls: tokio_rustls::TlsConnector,
}

impl Client {
    fn new(addr: SocketAddr, roots: &[CertificateDer<'static>]) -> Client {
        let config = meshpilot::security::tls::client_config(roots, None).expect("client TLS");
        let mut config = (*config).clone();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Client { addr, tls: tokio_rustls::TlsConnector::from(Arc::new(config)) }
    }

    /// POSTs `body` to `/validate` with `content_type`: the status and the body.
    async fn post(&self, content_type: &str, body: String) -> Result<(u16, String), String> {
        let tcp = tokio::net::TcpStream::connect(self.addr).await.map_err(|e| e.to_string())?;
        let name = ServerName::try_from(self.addr.ip().to_string()).map_err(|e| e.to_string())?;
        let tls = self.tls.connect(name, tcp).await.map_err(|e| format!("TLS: {e}"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        let request = http::Request::post("/validate")
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let bytes = response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// Reviews `object` (a CREATE in `default`): the response part of the answer.
    async fn review(&self, uid: &str, object: &Value) -> Value {
        let review = json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "", "kind": object["kind"]},
                "resource": {"group": "networking.istio.io", "version": "v1", "resource": plural(object)},
                "namespace": "default",
                "name": object["metadata"]["name"],
                "operation": "CREATE",
                "object": object,
            },
        });
        let (status, body) = self.post("application/json", review.to_string()).await.expect("the webhook answers");
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).expect("a JSON answer");
        assert_eq!(answer["apiVersion"], "admission.k8s.io/v1", "{answer}");
        assert_eq!(answer["kind"], "AdmissionReview", "{answer}");
        assert_eq!(answer["response"]["uid"], uid, "the uid is echoed: {answer}");
        answer["response"].clone()
    }
}

/// The resource of an object, as the API server names it (`serviceentries`).
fn plural(object: &Value) -> String {
    let kind = object["kind"].as_str().unwrap_or_default().to_lowercase();
    match kind.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{kind}s"),
    }
}

/// The webhook of `cp`, trusting the root in its CA directory, once it answers.
async fn client(cp: &Meshpilot) -> Client {
    let ca = common::secure::ca_from_dir(&cp.ca_dir()).await;
    let client = Client::new(cp.webhook_addr(), &ca.material().roots().expect("the CA's roots"));
    let up = poll(STARTUP_TIMEOUT, async || client.post("application/json", "{}".into()).await.is_ok()).await;
    assert!(up, "the webhook does not answer over TLS:\n{}", cp.log_tail(40));
    client
}

/// The documents of a corpus file with the error Istio reports for each (`_err`, removed from
/// the object; `None` where Istio records none).
fn corpus(file: &str) -> Vec<(Value, Option<String>)> {
    documents(&corpus_dir().join("crds").join(file))
        .into_iter()
        .map(|doc| {
            let mut value: Value =
                serde_saphyr::from_str(&doc.text).unwrap_or_else(|e| panic!("{}: {e}\n{}", doc.place, doc.text));
            let error = value.as_object_mut().and_then(|m| m.remove(ERROR_KEY));
            (value, error.and_then(|e| e.as_str().map(str::to_string)).filter(|e| e != "TODO"))
        })
        .collect()
}

#[tokio::test]
async fn reviews_over_https_allow_valid_and_deny_invalid_objects_with_istiods_messages() {
    let config = temp_dir("meshpilot-webhook-config-");
    let cp = Meshpilot::standalone(config.path()).webhook(free_addr(), &["127.0.0.1".to_string()]).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let webhook = client(&cp).await;

    let (mut allowed, mut denied) = (0.0, 0.0);
    for kind in ["destinationrule", "serviceentry", "workloadentry"] {
        for (i, (object, _)) in corpus(&format!("{kind}-valid.yaml")).iter().enumerate() {
            let response = webhook.review(&format!("{kind}-valid-{i}"), object).await;
            assert_eq!(response["allowed"], true, "{kind}-valid.yaml document {}: {response}", i + 1);
            allowed += 1.0;
        }
        for (i, (object, error)) in corpus(&format!("{kind}-invalid.yaml")).iter().enumerate() {
            let response = webhook.review(&format!("{kind}-invalid-{i}"), object).await;
            let place = format!("{kind}-invalid.yaml document {}", i + 1);
            assert_eq!(response["allowed"], false, "{place}: {response}");
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(
                message.starts_with("configuration is invalid: ")
                    || message.starts_with("error decoding configuration: "),
                "{place}: {message}"
            );
            // Istio's error is `field: reason`; meshpilot's message carries the same path and reason.
            if let Some(error) = error {
                let (field, reason) = error.split_once(": ").unwrap_or(("", error.as_str()));
                assert!(message.contains(field) && message.contains(reason), "{place}: {message}, Istio: {error}");
            }
            denied += 1.0;
        }
    }
    assert!(allowed + denied > 20.0, "the corpus was found and read ({allowed} + {denied} documents)");

    // A top-level field Kubernetes objects do not have, in the request's namespace.
    let mut vs = json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "r"},
        "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]},
    });
    assert_eq!(webhook.review("vs-valid", &vs).await["allowed"], true);
    vs["bogus"] = json!(true);
    let response = webhook.review("vs-extra", &vs).await;
    assert_eq!(response["status"]["message"], r#"unknown field "bogus" on VirtualService resource default/r"#);
    // A field of the spec that Istio's types lack: dropped as istiod drops it, with a warning.
    vs.as_object_mut().map(|m| m.remove("bogus"));
    vs["spec"]["http"][0]["retires"] = json!({"attempts": 3});
    let response = webhook.review("vs-unknown-spec-field", &vs).await;
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["warnings"][0], "spec.http[0].retires: unknown field `retires`, ignored as Istio ignores it");
    allowed += 2.0;
    denied += 1.0;

    // Requests that are not reviews are refused at the HTTP level.
    let (status, body) = webhook.post("application/json", "{not json".into()).await.expect("answered");
    assert_eq!(status, 400, "{body}");
    let (status, body) = webhook.post("text/yaml", "{}".into()).await.expect("answered");
    assert_eq!(status, 415, "{body}");

    // istiod's metrics count each verdict, failures by reason.
    let metrics = cp.metrics().await;
    let resource = [("group", "networking.istio.io"), ("version", "v1")];
    let passed: f64 = metrics.find("galley_validation_passed", &resource).iter().map(|s| s.value).sum();
    assert_eq!(passed, allowed);
    assert!(metrics.value("galley_validation_passed", &[("resource", "serviceentries")]) > 0.0);
    let failed: f64 = metrics.find("galley_validation_failed", &resource).iter().map(|s| s.value).sum();
    assert_eq!(failed, denied);
    assert!(metrics.sum("galley_validation_failed", &[("reason", "invalid_resource")]) > 0.0);
    assert_eq!(metrics.value("galley_validation_http_error", &[("status", "400")]), 1.0);
    assert_eq!(metrics.value("galley_validation_http_error", &[("status", "415")]), 1.0);
}

/// A ValidatingWebhookConfiguration for the Istio groups calling `url`, without a caBundle.
/// A caller naming a new resource in every request (the webhook is reachable by more than the
/// API server) cannot grow `/metrics`: resources meshpilot does not validate share one series.
#[tokio::test]
async fn bogus_resources_do_not_grow_the_metrics() {
    let config = temp_dir("meshpilot-webhook-config-");
    let cp = Meshpilot::standalone(config.path()).webhook(free_addr(), &["127.0.0.1".to_string()]).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let ca = common::secure::ca_from_dir(&cp.ca_dir()).await;
    let webhook = WebhookClient::new(cp.webhook_addr(), &ca.material().roots().expect("the CA's roots"));
    let up = poll(STARTUP_TIMEOUT, async || webhook.post(&json!({})).await.is_ok()).await;
    assert!(up, "the webhook does not answer over TLS:\n{}", cp.log_tail(40));
    let before = cp.try_metrics().await.expect("metrics").len();

    const BOGUS: usize = 3000;
    let vs = valid_virtual_service("r");
    let posts = futures::stream::iter(0..BOGUS).map(|i| {
        let resource = (format!("g{i}.evil.example"), format!("v{i}"), format!("{}-{i}", "x".repeat(200)));
        let review = admission_review(&format!("u{i}"), (&resource.0, &resource.1, &resource.2), &vs);
        let webhook = &webhook;
        async move { webhook.post(&review).await.map(|(status, _)| status) }
    });
    let statuses: Vec<_> = posts.buffer_unordered(16).collect().await;
    assert!(statuses.iter().all(|s| s == &Ok(200)), "every review is answered");
    // One real resource beside them keeps its own labels.
    let real = admission_review("real", ("networking.istio.io", "v1", "virtualservices"), &vs);
    assert_eq!(webhook.post(&real).await.map(|(s, _)| s), Ok(200));

    let text = cp.try_metrics().await.expect("metrics");
    let series = text.lines().filter(|l| l.starts_with("galley_validation_")).count();
    assert!(series <= 3, "{series} galley series:\n{text}");
    assert!(!text.contains("evil.example"), "a request's values became labels");
    assert!(text.len() < before + 4096, "/metrics grew from {before} to {} bytes", text.len());
    let metrics = cp.metrics().await;
    let unknown = [("group", "unknown"), ("version", "unknown"), ("resource", "unknown")];
    assert_eq!(metrics.value("galley_validation_passed", &unknown), BOGUS as f64);
    assert_eq!(metrics.value("galley_validation_passed", &[("resource", "virtualservices")]), 1.0);
}

fn webhook_configuration(url: &str) -> String {
    format!(
        r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {{name: {CONFIG_NAME}}}
webhooks:
- name: validation.meshpilot.io
  clientConfig: {{url: "{url}"}}
  rules:
  - apiGroups: [networking.istio.io, security.istio.io]
    apiVersions: ["*"]
    operations: [CREATE, UPDATE]
    resources: ["*"]
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: [v1]
"#
    )
}

/// The first webhook's caBundle, when set.
fn ca_bundle(config: &ValidatingWebhookConfiguration) -> Option<Vec<u8>> {
    let webhook = config.webhooks.as_ref()?.first()?;
    webhook.client_config.ca_bundle.as_ref().map(|b| b.0.clone()).filter(|b| !b.is_empty())
}

/// The VirtualService resource of the API server.
fn virtual_services() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
        "virtualservices",
    )
}

/// A VirtualService `name` in `default` for `host`.
fn virtual_service(name: &str, host: &str) -> DynamicObject {
    let mut vs = DynamicObject::new(name, &virtual_services()).within("default");
    vs.data = json!({"spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}});
    vs
}

#[tokio::test]
async fn the_api_server_trusts_the_patched_ca_bundle_and_refuses_invalid_objects() {
    let Some(api) = KubeApi::start().await else { return };
    let admin = api.admin().await;
    apply(&admin, "apiVersion: v1\nkind: Namespace\nmetadata: {name: istio-system}\n").await;
    let addr = free_addr();

    let dir = temp_dir("meshpilot-webhook-kube-");
    let kubeconfig = api.write_kubeconfig(dir.path(), "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
    let cp = Meshpilot::standalone_on_kubernetes(kubeconfig)
        .webhook(addr, &["127.0.0.1".to_string()])
        .arg("--webhook-config-name")
        .arg(CONFIG_NAME)
        .start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    // The configuration does not exist yet: meshpilot waits for it, and is patched once it does.
    cp.assert_running();
    apply(&admin, &webhook_configuration(&format!("https://{addr}/validate"))).await;

    let configs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let patched = poll(CONVERGE_TIMEOUT, async || {
        configs.get_opt(CONFIG_NAME).await.ok().flatten().as_ref().and_then(ca_bundle).is_some()
    })
    .await;
    assert!(patched, "the caBundle was never set:\n{}", cp.log_tail(40));
    let config = configs.get(CONFIG_NAME).await.expect("the configuration");
    let bundle = String::from_utf8(ca_bundle(&config).unwrap_or_default()).expect("PEM");
    assert!(bundle.starts_with("-----BEGIN CERTIFICATE-----"), "{bundle}");

    let vss: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &virtual_services());
    let refused = vss.create(&PostParams::default(), &virtual_service("bad", "bad host")).await;
    let error = refused.expect_err("the API server refuses an invalid VirtualService").to_string();
    assert!(error.contains("denied the request: configuration is invalid: spec.hosts[0]"), "{error}");
    vss.create(&PostParams::default(), &virtual_service("good", "reviews")).await.expect("a valid one is created");

    // A re-applied manifest carries no caBundle: it gets it back.
    let mut config = configs.get(CONFIG_NAME).await.expect("the configuration");
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.client_config.ca_bundle = None;
    }
    configs.replace(CONFIG_NAME, &PostParams::default(), &config).await.expect("the caBundle removed");
    let restored = poll(CONVERGE_TIMEOUT, async || {
        configs.get_opt(CONFIG_NAME).await.ok().flatten().as_ref().and_then(ca_bundle)
            == Some(bundle.clone().into_bytes())
    })
    .await;
    assert!(restored, "the caBundle was not put back:\n{}", cp.log_tail(40));
}

#[tokio::test]
async fn every_ingest_node_serves_the_webhook_and_the_leader_keeps_the_ca_bundle() {
    let Some(api) = KubeApi::start().await else { return };
    let admin = api.admin().await;
    apply(&admin, "apiVersion: v1\nkind: Namespace\nmetadata: {name: istio-system}\n").await;
    let dir = temp_dir("meshpilot-webhook-ingest-");
    let kubeconfig = api.write_kubeconfig(dir.path(), "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
    let etcd = api.etcd_endpoint();
    let ingests: Vec<Meshpilot> = ["a", "b"]
        .iter()
        .map(|id| {
            Meshpilot::ingest_on_kubernetes(&etcd, &kubeconfig)
                .id(id)
                .webhook(free_addr(), &["127.0.0.1".to_string()])
                .arg("--webhook-config-name")
                .arg(CONFIG_NAME)
                .start()
        })
        .collect();
    for node in &ingests {
        node.wait_ready(STARTUP_TIMEOUT).await;
    }
    let (leader, _) = wait_leader(&ingests, STARTUP_TIMEOUT, |_| true).await;
    let standby = &ingests[1 - leader];
    // The API server calls the standby: every node validates, with a certificate from the one CA
    // (the istio-ca-secret) whose root the leader put in the caBundle.
    apply(&admin, &webhook_configuration(&format!("https://{}/validate", standby.webhook_addr()))).await;

    let configs: Api<ValidatingWebhookConfiguration> = Api::all(admin.clone());
    let patched = poll(CONVERGE_TIMEOUT, async || {
        configs.get_opt(CONFIG_NAME).await.ok().flatten().as_ref().and_then(ca_bundle).is_some()
    })
    .await;
    assert!(patched, "the leader never set the caBundle:\n{}", ingests[leader].log_tail(40));
    let vss: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &virtual_services());
    let refused = vss.create(&PostParams::default(), &virtual_service("bad", "bad host")).await;
    let error = refused.expect_err("the API server refuses an invalid VirtualService").to_string();
    assert!(error.contains("denied the request: configuration is invalid: spec.hosts[0]"), "{error}");
    vss.create(&PostParams::default(), &virtual_service("good", "reviews")).await.expect("a valid one is created");

    // Only the leader writes the configuration.
    let keeper = "keeping the validating webhook's caBundle";
    assert!(ingests[leader].logs().contains(keeper), "the leader does not keep the caBundle");
    assert!(!standby.logs().contains(keeper), "a standby keeps the caBundle too");
}
