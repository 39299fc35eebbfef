//! TLS transport sockets: DestinationRule client TLS (upstream) and Gateway server TLS (downstream).
//!
//! Certificates are referenced by file path; `credentialName` (SDS) and ISTIO_MUTUAL need a
//! certificate provider meshpilot does not run, so those settings produce no TLS context.

use envoy_types::pb::envoy::config::core::v3::{data_source, transport_socket, DataSource, TransportSocket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::ValidationContextType, subject_alt_name_matcher::SanType, tls_parameters::TlsProtocol,
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SubjectAltNameMatcher, TlsCertificate,
    TlsParameters, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};

use super::names::ext;
use super::proto::{any, bool_value};
use crate::config::api::destination_rule::{ClientTlsMode, ClientTlsSettings};
use crate::config::api::gateway::ServerTlsSettings;

/// The upstream TLS socket for a DestinationRule's client TLS settings (SIMPLE or MUTUAL).
/// `default_sni` is used when the rule names no SNI (Istio uses the host for DNS services).
pub(super) fn upstream_transport_socket(tls: &ClientTlsSettings, default_sni: Option<&str>) -> Option<TransportSocket> {
    let mutual = match tls.mode? {
        ClientTlsMode::Simple => false,
        ClientTlsMode::Mutual => true,
        ClientTlsMode::Disable | ClientTlsMode::IstioMutual => return None,
    };
    let mut common = CommonTlsContext::default();
    if mutual {
        common.tls_certificates = certificate(&tls.client_certificate, &tls.private_key).into_iter().collect();
    }
    if tls.insecure_skip_verify != Some(true) && !tls.ca_certificates.is_empty() {
        common.validation_context_type = Some(ValidationContextType::ValidationContext(validation_context(
            &tls.ca_certificates,
            &tls.ca_crl,
            &tls.subject_alt_names,
        )));
    }
    let sni = if tls.sni.is_empty() { default_sni.unwrap_or_default().to_string() } else { tls.sni.clone() };
    let context = UpstreamTlsContext { common_tls_context: Some(common), sni, ..Default::default() };
    Some(TransportSocket {
        name: ext::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(context))),
    })
}

/// The downstream TLS socket of a gateway server terminating TLS (SIMPLE, MUTUAL,
/// OPTIONAL_MUTUAL); `None` when the server has no certificate files to serve.
pub(super) fn downstream_transport_socket(tls: &ServerTlsSettings, alpn: &[&str]) -> Option<TransportSocket> {
    let mode = tls.mode.as_deref().unwrap_or("PASSTHROUGH");
    let mutual = matches!(mode, "MUTUAL" | "OPTIONAL_MUTUAL");
    if !matches!(mode, "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL") {
        return None;
    }
    let certificate = certificate(&tls.server_certificate, &tls.private_key)?;
    let mut common = CommonTlsContext {
        tls_certificates: vec![certificate],
        alpn_protocols: alpn.iter().map(|p| p.to_string()).collect(),
        tls_params: tls_params(tls),
        ..Default::default()
    };
    if mutual && !tls.ca_certificates.is_empty() {
        let mut validation = validation_context(&tls.ca_certificates, &tls.ca_crl, &tls.subject_alt_names);
        validation.verify_certificate_spki = tls.verify_certificate_spki.clone();
        validation.verify_certificate_hash = tls.verify_certificate_hash.clone();
        common.validation_context_type = Some(ValidationContextType::ValidationContext(validation));
    }
    let context = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(bool_value(mode == "MUTUAL")),
        ..Default::default()
    };
    Some(TransportSocket {
        name: ext::TLS_TRANSPORT_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(any(context))),
    })
}

fn certificate(chain: &str, key: &str) -> Option<TlsCertificate> {
    if chain.is_empty() || key.is_empty() {
        return None;
    }
    Some(TlsCertificate { certificate_chain: Some(file(chain)), private_key: Some(file(key)), ..Default::default() })
}

fn validation_context(ca: &str, crl: &str, sans: &[String]) -> CertificateValidationContext {
    CertificateValidationContext {
        trusted_ca: Some(file(ca)),
        crl: (!crl.is_empty()).then(|| file(crl)),
        match_typed_subject_alt_names: sans.iter().map(|s| san_matcher(s)).collect(),
        ..Default::default()
    }
}

fn san_matcher(san: &str) -> SubjectAltNameMatcher {
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

fn tls_params(tls: &ServerTlsSettings) -> Option<TlsParameters> {
    let version = |v: Option<&str>| match v {
        Some("TLSV1_0") => TlsProtocol::TlSv10,
        Some("TLSV1_1") => TlsProtocol::TlSv11,
        Some("TLSV1_2") => TlsProtocol::TlSv12,
        Some("TLSV1_3") => TlsProtocol::TlSv13,
        _ => TlsProtocol::TlsAuto,
    } as i32;
    let params = TlsParameters {
        tls_minimum_protocol_version: version(tls.min_protocol_version.as_deref()),
        tls_maximum_protocol_version: version(tls.max_protocol_version.as_deref()),
        cipher_suites: tls.cipher_suites.clone(),
        ..Default::default()
    };
    (params != TlsParameters::default()).then_some(params)
}

fn file(path: &str) -> DataSource {
    DataSource { specifier: Some(data_source::Specifier::Filename(path.to_string())), ..Default::default() }
}
