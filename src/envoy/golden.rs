//! Golden tests: every resource type for a bookinfo-like mesh, from a sidecar's and a gateway's
//! point of view, rendered as text. `UPDATE_GOLDEN=1 cargo test --lib envoy::` rewrites them.

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use envoy_types::pb::envoy::extensions::clusters::dns::v3::DnsCluster;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::{Cors, CorsPolicy};
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::listener::original_src::v3::OriginalSrc;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{DownstreamTlsContext, UpstreamTlsContext};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use prost::{Message, Name};

use super::generate;
use super::testing::{router, sidecar, sidecar_at, snapshot, testdata, testdata_snapshot};
use crate::envoy::ProxyView;
use crate::envoy::TypeUrl;
use crate::snapshot::Snapshot;

type Decoder = fn(&[u8]) -> Option<String>;

fn pretty<T: Message + Default + std::fmt::Debug>(bytes: &[u8]) -> Option<String> {
    T::decode(bytes).ok().map(|m| format!("{m:#?}"))
}

/// Message types that appear packed in generated resources.
fn decoder(type_url: &str) -> Option<Decoder> {
    let table: [(String, Decoder); 22] = [
        (Cluster::type_url(), pretty::<Cluster>),
        (ClusterLoadAssignment::type_url(), pretty::<ClusterLoadAssignment>),
        (Listener::type_url(), pretty::<Listener>),
        (RouteConfiguration::type_url(), pretty::<RouteConfiguration>),
        (HttpConnectionManager::type_url(), pretty::<HttpConnectionManager>),
        (TcpProxy::type_url(), pretty::<TcpProxy>),
        (Router::type_url(), pretty::<Router>),
        (Cors::type_url(), pretty::<Cors>),
        (CorsPolicy::type_url(), pretty::<CorsPolicy>),
        (HttpFault::type_url(), pretty::<HttpFault>),
        (TlsInspector::type_url(), pretty::<TlsInspector>),
        (HttpInspector::type_url(), pretty::<HttpInspector>),
        (OriginalDst::type_url(), pretty::<OriginalDst>),
        (OriginalSrc::type_url(), pretty::<OriginalSrc>),
        (PreviousHostsPredicate::type_url(), pretty::<PreviousHostsPredicate>),
        (HttpProtocolOptions::type_url(), pretty::<HttpProtocolOptions>),
        (UpstreamTlsContext::type_url(), pretty::<UpstreamTlsContext>),
        (DownstreamTlsContext::type_url(), pretty::<DownstreamTlsContext>),
        (FileAccessLog::type_url(), pretty::<FileAccessLog>),
        (DnsCluster::type_url(), pretty::<DnsCluster>),
        (CaresDnsResolverConfig::type_url(), pretty::<CaresDnsResolverConfig>),
        (String::new(), |_| None),
    ];
    table.into_iter().find(|(url, _)| url == type_url).map(|(_, d)| d)
}

/// Renders all four types for a view: resources in name order, packed messages decoded, map
/// entries sorted (prost maps are HashMaps).
pub(super) fn render(s: &Snapshot, v: &ProxyView) -> String {
    let mut out = String::new();
    for type_url in TypeUrl::PUSH_ORDER {
        for r in generate(type_url, s, v) {
            out.push_str(&format!("=== {type_url} {}\n", r.name));
            let text = decoder(&r.body.type_url).and_then(|d| d(&r.body.value)).unwrap_or_default();
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            for line in sort_maps(&expand_any(&lines)) {
                out.push_str(&line);
                out.push('\n');
            }
        }
    }
    out
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// Replaces each `Any { type_url, value: [bytes] }` block with the decoded message.
fn expand_any(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        if !line.trim_end().ends_with("Any {") {
            out.push(line.clone());
            i += 1;
            continue;
        }
        let indent = indent_of(line);
        let end = (i + 1..lines.len())
            .find(|j| indent_of(&lines[*j]) == indent && lines[*j].trim_start().starts_with('}'))
            .unwrap_or(lines.len() - 1);
        let block = &lines[i + 1..end];
        let type_url = block
            .iter()
            .find_map(|l| l.trim().strip_prefix("type_url: \"").and_then(|r| r.strip_suffix("\",")))
            .unwrap_or_default();
        let bytes: Vec<u8> = block.iter().filter_map(|l| l.trim().trim_end_matches(',').parse::<u8>().ok()).collect();
        match decoder(type_url).and_then(|d| d(&bytes)) {
            Some(text) => {
                let prefix = &line[..line.len() - "Any {".len()];
                let decoded: Vec<String> = text.lines().map(str::to_string).collect();
                let expanded = expand_any(&decoded);
                let last = expanded.len().saturating_sub(1);
                for (k, l) in expanded.iter().enumerate() {
                    let mut rendered =
                        if k == 0 { format!("{prefix}{l}") } else { format!("{}{l}", " ".repeat(indent)) };
                    if k == last {
                        rendered.push_str(lines[end].trim_start().trim_start_matches('}'));
                    }
                    out.push(rendered);
                }
            }
            None => out.extend(lines[i..=end].iter().cloned()),
        }
        i = end + 1;
    }
    out
}

/// Sorts the entries of every `name: {` map block by their text.
fn sort_maps(lines: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        out.push(line.clone());
        i += 1;
        if !line.trim_end().ends_with(": {") {
            continue;
        }
        let indent = indent_of(line);
        let mut entries: Vec<Vec<String>> = Vec::new();
        while i < lines.len() && !(indent_of(&lines[i]) == indent && lines[i].trim_start().starts_with('}')) {
            if indent_of(&lines[i]) == indent + 4 && lines[i].trim_start().starts_with('"') {
                entries.push(Vec::new());
            }
            if let Some(e) = entries.last_mut() {
                e.push(lines[i].clone());
            }
            i += 1;
        }
        let mut rendered: Vec<Vec<String>> = entries.iter().map(|e| sort_maps(e)).collect();
        rendered.sort();
        out.extend(rendered.into_iter().flatten());
    }
    out
}

fn check_golden(name: &str, actual: &str) {
    // Certificate paths point into the checkout, wherever it is: goldens name it `$TESTDATA`.
    let actual = actual.replace(&testdata().display().to_string(), "$TESTDATA");
    let actual = actual.as_str();
    let path = testdata().join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let first = expected.lines().zip(actual.lines()).position(|(a, b)| a != b);
        panic!(
            "{} differs from the generated output (first differing line: {:?}); rerun with UPDATE_GOLDEN=1 to accept",
            path.display(),
            first.map(|n| n + 1)
        );
    }
}

fn bookinfo() -> Snapshot {
    let yaml = std::fs::read_to_string(testdata().join("bookinfo.yaml")).expect("read bookinfo.yaml");
    snapshot(&yaml)
}

#[test]
fn sidecar_golden() {
    let s = bookinfo();
    check_golden("sidecar.golden", &render(&s, &sidecar("bookinfo", &[("app", "productpage")])));
}

#[test]
fn router_golden() {
    let s = bookinfo();
    check_golden("router.golden", &render(&s, &router("bookinfo", &[("istio", "ingressgateway")])));
}

#[test]
fn inbound_instances_golden() {
    // HTTP port with targetPort 8080, TCP port, sniffed port, passthrough chains.
    let s = testdata_snapshot("inbound.yaml");
    check_golden("inbound-instances.golden", &render(&s, &sidecar_at("shop", &[("app", "orders")], &["10.2.0.5"])));
}

#[test]
fn inbound_sidecar_ingress_golden() {
    // Sidecar ingress: loopback, workload-IP, unix and original-destination endpoints, one bound port.
    let s = testdata_snapshot("inbound.yaml");
    check_golden("inbound-ingress.golden", &render(&s, &sidecar_at("shop", &[("app", "legacy")], &["10.2.0.7"])));
}

#[test]
fn generation_is_deterministic() {
    let s = bookinfo();
    let v = sidecar("bookinfo", &[("app", "productpage")]);
    for type_url in TypeUrl::PUSH_ORDER {
        assert_eq!(generate(type_url, &s, &v), generate(type_url, &s, &v));
    }
}
