//! Istio mutual TLS contexts: the inbound side's (a client certificate required, checked against
//! the mesh root) and the client side's ISTIO_MUTUAL. Certificates come from pilot-agent over
//! SDS (`default`, `ROOTCA`); nothing here names a file.

use envoy_types::pb::envoy::config::core::v3::{transport_socket, TransportSocket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    subject_alt_name_matcher::SanType,
    tls_parameters::TlsProtocol,
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SubjectAltNameMatcher, TlsParameters,
    UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};

use super::names::ext;
use super::proto::{any, bool_value};
use super::sds::{agent_secret, ROOT_CA, WORKLOAD_CERT};

/// Istio's cipher suites for mesh mutual TLS.
const MESH_CIPHERS: [&str; 6] = [
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-GCM-SHA256",
];

/// ALPN a client sidecar offers to an in-mesh cluster (Istio's, with metadata exchange).
pub(super) const ALPN_IN_MESH: [&str; 2] = ["istio-peer-exchange", "istio"];
/// ALPN a client sidecar offers to an in-mesh HTTP/2 cluster.
pub(super) const ALPN_IN_MESH_H2: [&str; 3] = ["istio-peer-exchange", "istio", "h2"];
/// ALPN values a mesh client may offer: the filter chain match of mutual TLS under PERMISSIVE.
pub(super) const ALL_ISTIO_MTLS_ALPNS: [&str; 5] =
    ["istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"];
/// ALPN values of HTTP a client sidecar sent over mutual TLS.
pub(super) const MTLS_HTTP_ALPNS: [&str; 3] = ["istio-http/1.0", "istio-http/1.1", "istio-h2"];
/// ALPN values of TCP a client sidecar sent over mutual TLS.
pub(super) const MTLS_TCP_ALPNS: [&str; 2] = ["istio-peer-exchange", "istio"];

/// Which server ALPN an inbound chain offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum InboundTls {
    /// An HTTP chain: h2 and HTTP/1.1 (never `istio`, which would spoil HTTP/2 negotiation).
    Http,
    /// A TCP chain: metadata exchange, h2 and HTTP/1.1.
    Tcp,
}

/// The inbound mutual TLS socket: the workload certificate, a client certificate required,
/// verified against the mesh root and of a SPIFFE identity in `trust_domain` (Istio's
/// `BuildInboundTLS`).
pub(super) fn inbound_transport_socket(kind: InboundTls, trust_domain: &str) -> TransportSocket {
    let alpn: &[&str] = match kind {
        InboundTls::Http => &["h2", "http/1.1"],
        InboundTls::Tcp => &["istio-peer-exchange", "h2", "http/1.1"],
    };
    let mut common = mesh_common_context(&[]);
    if let Some(ValidationContextType::CombinedValidationContext(combined)) = &mut common.validation_context_type {
        let peers = StringMatcher {
            match_pattern: Some(MatchPattern::Prefix(format!("spiffe://{trust_domain}/"))),
            ..Default::default()
        };
        #[allow(deprecated)] // istiod's field (see `exact_sans`)
        combined.default_validation_context.get_or_insert_with(Default::default).match_subject_alt_names.push(peers);
    }
    common.alpn_protocols = strings(alpn);
    common.tls_params = Some(TlsParameters {
        tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
        tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
        cipher_suites: strings(&MESH_CIPHERS),
        ..Default::default()
    });
    let context = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(bool_value(true)),
        ..Default::default()
    };
    tls_socket(any(context))
}

/// The ISTIO_MUTUAL client socket: the workload certificate, the server checked against the mesh
/// root and, when known, the identities in `sans`; SNI `sni`; Istio's in-mesh ALPN.
pub(super) fn istio_mutual_transport_socket(sni: &str, sans: &[String], http2: bool) -> TransportSocket {
    let mut common = mesh_common_context(sans);
    common.tls_params = Some(upstream_tls_params());
    common.alpn_protocols = if http2 { strings(&ALPN_IN_MESH_H2) } else { strings(&ALPN_IN_MESH) };
    let context = UpstreamTlsContext { common_tls_context: Some(common), sni: sni.to_string(), ..Default::default() };
    tls_socket(any(context))
}

/// A gateway server's ISTIO_MUTUAL: the gateway's workload certificate, a client certificate
/// required and verified against the mesh root (and `sans`, when given).
pub(super) fn istio_mutual_server_socket(alpn: &[&str], sans: &[String]) -> TransportSocket {
    let mut common = mesh_common_context(sans);
    common.alpn_protocols = strings(alpn);
    let context = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(bool_value(true)),
        ..Default::default()
    };
    tls_socket(any(context))
}

/// The protocol versions of every TLS origination, as istiod sets them: TLS 1.2 up to 1.3 (Envoy's
/// client default stops at 1.2).
pub(super) fn upstream_tls_params() -> TlsParameters {
    TlsParameters {
        tls_minimum_protocol_version: TlsProtocol::TlSv12 as i32,
        tls_maximum_protocol_version: TlsProtocol::TlSv13 as i32,
        ..Default::default()
    }
}

/// Certificate `default`, validation against `ROOTCA` with exact SAN matches.
fn mesh_common_context(sans: &[String]) -> CommonTlsContext {
    CommonTlsContext {
        tls_certificate_sds_secret_configs: vec![agent_secret(WORKLOAD_CERT)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(exact_sans(sans)),
                validation_context_sds_secret_config: Some(agent_secret(ROOT_CA)),
                ..Default::default()
            },
        )),
        ..Default::default()
    }
}

/// Exact SAN checks as istiod writes them: untyped string matchers (Envoy's deprecated
/// `match_subject_alt_names`, which match a SAN of any type; a SPIFFE URI cannot be a DNS name).
#[allow(deprecated)]
pub(super) fn exact_sans(sans: &[String]) -> CertificateValidationContext {
    let exact =
        |san: &String| StringMatcher { match_pattern: Some(MatchPattern::Exact(san.clone())), ..Default::default() };
    CertificateValidationContext { match_subject_alt_names: sans.iter().map(exact).collect(), ..Default::default() }
}

/// An exact SAN match: a URI SAN for `scheme://` names (SPIFFE identities), else a DNS SAN.
pub(super) fn san_matcher(san: &str) -> SubjectAltNameMatcher {
    let san_type = if san.contains("://") { SanType::Uri } else { SanType::Dns };
    SubjectAltNameMatcher {
        san_type: san_type as i32,
        matcher: Some(StringMatcher {
            match_pattern: Some(MatchPattern::Exact(san.to_string())),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The TLS transport socket around a packed context.
pub(super) fn tls_socket(context: envoy_types::pb::google::protobuf::Any) -> TransportSocket {
    TransportSocket {
        name: ext::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(context)),
    }
}

fn strings(values: &[&str]) -> Vec<String> {
    values.iter().map(|v| v.to_string()).collect()
}
