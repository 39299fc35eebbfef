//! CUSTOM AuthorizationPolicies enforced by a real Envoy (1.40) through ext_authz: an ingress
//! gateway served by standalone meshpilot from files, with a mesh config naming two external
//! authorizers this test runs itself on 127.0.0.1: one over HTTP (axum) and one over gRPC (tonic,
//! `envoy.service.auth.v3.Authorization/Check`). Both allow a request carrying
//! `x-ext-authz: allow` (adding `x-ext-authz-check: http|grpc` to it on the way to the backend)
//! and refuse any other with 403 and a body naming themselves.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr, TcpListener as StdTcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::{HttpStatus, StatusCode as EnvoyStatus};
use envoy_types::pb::envoy::service::auth::v3::authorization_server::{Authorization, AuthorizationServer};
use envoy_types::pb::envoy::service::auth::v3::{
    check_response::HttpResponse as CheckAnswer, CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use serde_json::Value;

use common::backend::Backend;
use common::files::{temp_dir_with, write_atomic};
use common::http::HttpResponse;
use common::ingress::{backend_of, Ingress};
use common::istio::*;
use common::mesh::*;
use common::meshpilot::Meshpilot;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};

const HOST: &str = "shop.example.com";
/// The header the authorizers decide on, and its allowing value.
const DECISION_HEADER: &str = "x-ext-authz";
/// The header the authorizers add to an allowed request.
const CHECKED_HEADER: &str = "x-ext-authz-check";
/// gRPC code PERMISSION_DENIED.
const PERMISSION_DENIED: i32 = 7;

/// An external authorizer on its own thread and runtime, stopped (its connections closed) when
/// dropped, like [`Backend`].
struct Authorizer {
    addr: SocketAddr,
    checks: Arc<AtomicU64>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Authorizer {
    /// The HTTP authorizer.
    fn http() -> Authorizer {
        Authorizer::start("http", |listener, checks, stop| {
            Box::pin(async move {
                let router = axum::Router::new().fallback(move |headers: HeaderMap| {
                    let checks = checks.clone();
                    async move {
                        checks.fetch_add(1, Ordering::SeqCst);
                        if headers.get(DECISION_HEADER).is_some_and(|v| v == "allow") {
                            (StatusCode::OK, [(CHECKED_HEADER, "http")], "").into_response()
                        } else {
                            (StatusCode::FORBIDDEN, "denied by ext-authz (http)").into_response()
                        }
                    }
                });
                let server = axum::serve(listener, router).with_graceful_shutdown(async {
                    let _ = stop.await;
                });
                let _ = server.await;
            })
        })
    }

    /// The gRPC authorizer.
    fn grpc() -> Authorizer {
        Authorizer::start("grpc", |listener, checks, stop| {
            Box::pin(async move {
                let service = AuthorizationServer::new(GrpcAuthorizer { checks });
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stop.await;
                    })
                    .await;
            })
        })
    }

    fn start(
        name: &str,
        serve: impl FnOnce(
                tokio::net::TcpListener,
                Arc<AtomicU64>,
                tokio::sync::oneshot::Receiver<()>,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            + Send
            + 'static,
    ) -> Authorizer {
        let listener = StdTcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind an authorizer");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let addr = listener.local_addr().expect("authorizer address");
        let checks = Arc::new(AtomicU64::new(0));
        let counted = checks.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("ext-authz-{name}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
                    serve(listener, counted, rx).await;
                });
                // Dropping the runtime ends every connection task: nothing is answered after drop.
            })
            .expect("spawn authorizer");
        Authorizer { addr, checks, shutdown: Some(tx), thread: Some(thread) }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn checks(&self) -> u64 {
        self.checks.load(Ordering::SeqCst)
    }
}

impl Drop for Authorizer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct GrpcAuthorizer {
    checks: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl Authorization for GrpcAuthorizer {
    async fn check(
        &self,
        request: tonic::Request<CheckRequest>,
    ) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        let headers = request
            .into_inner()
            .attributes
            .and_then(|a| a.request)
            .and_then(|r| r.http)
            .map(|h| h.headers)
            .unwrap_or_default();
        let response = if headers.get(DECISION_HEADER).is_some_and(|v| v == "allow") {
            let header = HeaderValue { key: CHECKED_HEADER.into(), value: "grpc".into(), ..Default::default() };
            CheckResponse {
                status: Some(RpcStatus::default()),
                http_response: Some(CheckAnswer::OkResponse(OkHttpResponse {
                    headers: vec![HeaderValueOption { header: Some(header), ..Default::default() }],
                    ..Default::default()
                })),
                ..Default::default()
            }
        } else {
            CheckResponse {
                status: Some(RpcStatus { code: PERMISSION_DENIED, ..Default::default() }),
                http_response: Some(CheckAnswer::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus { code: EnvoyStatus::Forbidden as i32 }),
                    body: "denied by ext-authz (grpc)".into(),
                    ..Default::default()
                })),
                ..Default::default()
            }
        };
        Ok(tonic::Response::new(response))
    }
}

/// The mesh config: the two authorizers, the HTTP one failing closed (with 503) and failing open.
fn mesh_config() -> String {
    dedent(&format!(
        r#"
        extensionProviders:
        - name: http-closed
          envoyExtAuthzHttp:
            service: {http}
            port: 8000
            statusOnError: "503"
            includeRequestHeadersInCheck: [{DECISION_HEADER}]
            headersToUpstreamOnAllow: [{CHECKED_HEADER}]
        - name: http-open
          envoyExtAuthzHttp:
            service: {NS}/{http}
            port: 8000
            failOpen: true
            includeRequestHeadersInCheck: [{DECISION_HEADER}]
            headersToUpstreamOnAllow: [{CHECKED_HEADER}]
        - name: grpc
          envoyExtAuthzGrpc:
            service: {grpc}
            port: 9000
            timeout: 5s
        - name: tracing
          zipkin: {{service: zipkin.istio-system.svc.cluster.local, port: 9411}}
        "#,
        http = fqdn("authz-http"),
        grpc = fqdn("authz-grpc"),
    ))
}

/// A ServiceEntry for an authorizer: `NAME.shop.svc.cluster.local` on `port` (`protocol`), its one
/// endpoint at 127.0.0.1:`target`.
fn authorizer_service(name: &str, port: u16, protocol: &str, target: u16) -> String {
    let port_name = protocol.to_lowercase();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: {port}, name: \
         {port_name}, protocol: {protocol}}}]\n  endpoints: [{{address: 127.0.0.1, ports: {{{port_name}: {target}}}}}]\n",
        host = fqdn(name)
    )
}

/// A CUSTOM policy in `istio-system` selecting the gateway, checking `/private*` with `provider`.
fn custom_policy(provider: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: ext, namespace: istio-system}}\n\
         spec:\n  action: CUSTOM\n  provider: {{name: {provider}}}\n  selector:\n    matchLabels: {{istio: ingressgateway}}\n  \
         rules: [{{to: [{{operation: {{paths: [/private*]}}}}]}}]\n"
    )
}

/// One meshpilot (with the mesh config), the gateway Envoy routing [`HOST`] to backend `web`.
struct Setup {
    config: tempfile::TempDir,
    cp: Meshpilot,
    envoy: common::envoy::Envoy,
    gw: Ingress,
    _mesh: tempfile::TempDir,
    _backend: Backend,
}

async fn start(http: &Authorizer, grpc: &Authorizer) -> Setup {
    let backend = Backend::new("web");
    let port = common::ports::free_port();
    let vs = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: shop}}\nspec:\n  \
         hosts: [{HOST}]\n  gateways: [shop/gw]\n  http:\n  - route:\n    - destination: {{host: web}}\n"
    );
    let config = temp_dir_with(&[
        ("gateway.yaml", gateway(port).as_str()),
        ("services.yaml", service_entry("web", 80, &[(&backend, "v1")]).as_str()),
        ("routes.yaml", vs.as_str()),
        ("authz-http.yaml", authorizer_service("authz-http", 8000, "HTTP", http.port()).as_str()),
        ("authz-grpc.yaml", authorizer_service("authz-grpc", 9000, "GRPC", grpc.port()).as_str()),
    ]);
    let mesh = temp_dir_with(&[("mesh.yaml", mesh_config().as_str())]);
    let cp = Meshpilot::standalone(config.path()).mesh_config(mesh.path().join("mesh.yaml")).start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let envoy = start_gateway(&cp).await;
    let gw = Ingress::new(port, HOST);
    Setup { config, cp, envoy, gw, _mesh: mesh, _backend: backend }
}

const ALLOW: [(&str, &str); 1] = [(DECISION_HEADER, "allow")];

/// Waits until GET `path` with `headers` answers `status`.
async fn wait_status(s: &Setup, path: &str, headers: &[(&str, &str)], status: u16) -> HttpResponse {
    s.gw.wait_answer(path, headers, &format!("status {status}"), |r| r.status == status).await
}

/// The value of [`CHECKED_HEADER`] the backend received (which authorizer allowed the request).
fn checked_by(r: &HttpResponse) -> Option<String> {
    let echo: Value = serde_json::from_str(&r.body).ok()?;
    echo["headers"][CHECKED_HEADER].as_str().map(str::to_string)
}

/// Waits until an allowed GET of `/private` reaches the backend checked by `authorizer`.
async fn wait_checked_by(s: &Setup, authorizer: &str) -> HttpResponse {
    s.gw.wait_answer("/private", &ALLOW, &format!("an answer allowed by the {authorizer} authorizer"), |r| {
        checked_by(r).as_deref() == Some(authorizer)
    })
    .await
}

/// The `errors` of `/debug/configz` about AuthorizationPolicy `name`.
async fn policy_errors(cp: &Meshpilot, name: &str) -> Vec<Value> {
    let configz = cp.admin_json("/debug/configz").await;
    configz["errors"]
        .as_array()
        .map(|e| e.iter().filter(|e| e["kind"] == "AuthorizationPolicy" && e["name"] == name).cloned().collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn custom_policies_ask_the_http_and_grpc_authorizers() {
    let http = Authorizer::http();
    let grpc = Authorizer::grpc();
    let s = start(&http, &grpc).await;
    assert_eq!(wait_status(&s, "/private", &[], 200).await.status, 200, "no policy: everything passes");

    // The HTTP authorizer decides on /private*; other paths are not sent to it.
    write_atomic(s.config.path(), "policy.yaml", &custom_policy("http-closed"));
    let r = wait_status(&s, "/private", &[], 403).await;
    assert!(r.body.contains("denied by ext-authz (http)"), "the authorizer's answer: {r:?}");
    let r = s.gw.get("/private/orders", &ALLOW).await;
    assert_eq!(backend_of(&r).as_deref(), Some("web"), "allowed: {r:?}");
    assert_eq!(checked_by(&r).as_deref(), Some("http"), "headersToUpstreamOnAllow: {r:?}");
    let before = http.checks();
    let r = s.gw.get("/public", &[]).await;
    assert_eq!(backend_of(&r).as_deref(), Some("web"), "/public matches no rule: {r:?}");
    assert_eq!(http.checks(), before, "/public is not sent to the authorizer");

    // The gRPC authorizer.
    write_atomic(s.config.path(), "policy.yaml", &custom_policy("grpc"));
    let r = wait_checked_by(&s, "grpc").await;
    assert_eq!(backend_of(&r).as_deref(), Some("web"), "{r:?}");
    let r = s.gw.get("/private", &[]).await;
    assert_eq!(r.status, 403, "{r:?}");
    assert!(r.body.contains("denied by ext-authz (grpc)"), "the authorizer's answer: {r:?}");
    assert!(grpc.checks() >= 2, "the gRPC authorizer was asked");
    assert_no_rejections(&s.envoy).await;
    drop(s.cp);
}

#[tokio::test]
async fn an_unreachable_authorizer_fails_closed_unless_fail_open() {
    let http = Authorizer::http();
    let grpc = Authorizer::grpc();
    let s = start(&http, &grpc).await;
    write_atomic(s.config.path(), "policy.yaml", &custom_policy("http-closed"));
    wait_checked_by(&s, "http").await;

    // Stopped: failOpen false refuses even what the authorizer would allow, with statusOnError.
    drop(http);
    let r = wait_status(&s, "/private", &ALLOW, 503).await;
    assert_eq!(backend_of(&r), None, "refused by Envoy, not answered by the backend: {r:?}");
    assert_eq!(s.gw.get("/private", &[]).await.status, 503);
    assert_eq!(s.gw.get("/public", &[]).await.status, 200, "paths the policy does not match still pass");

    // failOpen true lets the request through while the authorizer is down.
    write_atomic(s.config.path(), "policy.yaml", &custom_policy("http-open"));
    let r = wait_status(&s, "/private", &[], 200).await;
    assert_eq!(backend_of(&r).as_deref(), Some("web"), "{r:?}");
    assert_eq!(checked_by(&r), None, "nobody checked it");

    // A stopped gRPC authorizer, failing closed with Envoy's default 403.
    write_atomic(s.config.path(), "policy.yaml", &custom_policy("grpc"));
    wait_checked_by(&s, "grpc").await;
    drop(grpc);
    let r = wait_status(&s, "/private", &ALLOW, 403).await;
    assert!(!r.body.contains("denied by ext-authz"), "Envoy refused it itself: {r:?}");
    assert_no_rejections(&s.envoy).await;
    drop(s.cp);
}

#[tokio::test]
async fn a_custom_policy_that_cannot_be_enforced_denies_its_scope() {
    let http = Authorizer::http();
    let grpc = Authorizer::grpc();
    let s = start(&http, &grpc).await;
    assert_eq!(wait_status(&s, "/public", &[], 200).await.status, 200);

    // A provider the mesh config lacks (or one that is no authorizer): the whole scope is
    // denied, /public included, and the reason is reported.
    for provider in ["nope", "tracing"] {
        write_atomic(s.config.path(), "policy.yaml", &custom_policy(provider));
        let found = format!("but found \"{provider}\"");
        let reported = |errors: &[Value]| {
            errors
                .iter()
                .any(|e| e["field"] == "spec.provider.name" && e["reason"].as_str().is_some_and(|r| r.contains(&found)))
        };
        poll(CONVERGE_TIMEOUT, async || reported(&policy_errors(&s.cp, "ext").await)).await;
        let errors = policy_errors(&s.cp, "ext").await;
        assert!(reported(&errors), "reported: {errors:?}");
        let r = wait_status(&s, "/public", &ALLOW, 403).await;
        assert!(r.body.contains("RBAC"), "Envoy's RBAC refused it: {r:?}");
        assert_eq!(s.gw.get("/private", &ALLOW).await.status, 403, "{provider}");
    }
    assert_eq!((http.checks(), grpc.checks()), (0, 0), "no authorizer was asked");

    // Fixed: the scope opens again and the authorizer decides.
    write_atomic(s.config.path(), "policy.yaml", &custom_policy("grpc"));
    assert_eq!(wait_status(&s, "/public", &[], 200).await.status, 200);
    wait_checked_by(&s, "grpc").await;
    assert!(policy_errors(&s.cp, "ext").await.is_empty(), "nothing left to report");
    assert_no_rejections(&s.envoy).await;
    drop(s.cp);
}
