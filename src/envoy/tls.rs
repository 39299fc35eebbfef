//! TLS transport sockets: DestinationRule client TLS (upstream) and Gateway server TLS
//! (downstream). Every certificate is an SDS reference (see `sds`): file paths become Istio's
//! `file-cert:`/`file-root:` names pilot-agent serves, `credentialName` a `kubernetes://` secret
//! the control plane serves over ADS, ISTIO_MUTUAL the workload's `default` and `ROOTCA`. A
//! proxy lacking a file then waits for that one secret instead of rejecting the whole update.

use envoy_types::pb::envoy::config::core::v3::{data_source, DataSource, TransportSocket};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    tls_parameters::TlsProtocol,
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, TlsParameters,
    UpstreamTlsContext,
};

use super::mtls::{
    exact_sans, istio_mutual_server_socket, istio_mutual_transport_socket, san_matcher, tls_socket, upstream_tls_params,
};
use super::proto::{any, bool_value};
use super::sds::{ads_secret, agent_secret, credential_resource_name, file_cert_name, file_root_name, CA_SUFFIX};
use crate::config::api::destination_rule::{ClientTlsMode, ClientTlsSettings};
use crate::config::api::gateway::ServerTlsSettings;

/// Istio's name of the system CA bundle pilot-agent serves (verification without a CA file).
const SYSTEM_ROOT: &str = "file-root:system";

/// What an upstream TLS context needs to know about its cluster.
#[derive(Debug, Clone, Default)]
pub(super) struct Upstream<'a> {
    /// SNI of SIMPLE/MUTUAL without one of their own (the host, for DNS services).
    pub default_sni: Option<&'a str>,
    /// Istio's ISTIO_MUTUAL SNI: `outbound_.PORT_.SUBSET_.HOST`.
    pub istio_sni: String,
    /// Identities the service's workloads run as (ISTIO_MUTUAL SAN checks).
    pub service_sans: Vec<String>,
    /// Whether the cluster speaks HTTP/2 (ISTIO_MUTUAL offers `h2`).
    pub http2: bool,
}

/// The upstream TLS socket for a DestinationRule's client TLS settings; `None` for DISABLE.
pub(super) fn upstream_transport_socket(tls: &ClientTlsSettings, upstream: &Upstream<'_>) -> Option<TransportSocket> {
    let mutual = match tls.mode? {
        ClientTlsMode::Simple => false,
        ClientTlsMode::Mutual => true,
        ClientTlsMode::Disable => return None,
        ClientTlsMode::IstioMutual => {
            let sni = if tls.sni.is_empty() { upstream.istio_sni.as_str() } else { tls.sni.as_str() };
            let sans = if tls.subject_alt_names.is_empty() { &upstream.service_sans } else { &tls.subject_alt_names };
            return Some(istio_mutual_transport_socket(sni, sans, upstream.http2));
        }
    };
    let credential = (!tls.credential_name.is_empty()).then(|| credential_resource_name(&tls.credential_name));
    let mut common = CommonTlsContext { tls_params: Some(upstream_tls_params()), ..Default::default() };
    if mutual {
        common.tls_certificate_sds_secret_configs = match &credential {
            Some(name) => vec![ads_secret(name)],
            None => key_pair(&tls.client_certificate, &tls.private_key).into_iter().collect(),
        };
    }
    if tls.insecure_skip_verify != Some(true) {
        let root = match &credential {
            Some(name) => ads_secret(&format!("{name}{CA_SUFFIX}")),
            None if !tls.ca_certificates.is_empty() => agent_secret(&file_root_name(&tls.ca_certificates)),
            // As Istio (VERIFY_CERTIFICATE_AT_CLIENT): no CA named means the system's, not none.
            None => agent_secret(SYSTEM_ROOT),
        };
        common.validation_context_type = Some(combined(validation_defaults(&tls.ca_crl, &tls.subject_alt_names), root));
    }
    let sni = if tls.sni.is_empty() { upstream.default_sni.unwrap_or_default().to_string() } else { tls.sni.clone() };
    let context = UpstreamTlsContext { common_tls_context: Some(common), sni, ..Default::default() };
    Some(tls_socket(any(context)))
}

/// The TLS socket of a fetch Envoy makes itself (a JWKS URI): verified against the CA bundle
/// file `ca_bundle` every proxy image has, and `host`. No SDS: a proxy without pilot-agent
/// fetches keys too, and the bundle is not workload material.
pub(super) fn system_trusted_upstream_socket(host: &str, ca_bundle: &str) -> TransportSocket {
    let validation = CertificateValidationContext {
        trusted_ca: Some(file(ca_bundle)),
        match_typed_subject_alt_names: vec![san_matcher(host)],
        ..Default::default()
    };
    let common = CommonTlsContext {
        validation_context_type: Some(ValidationContextType::ValidationContext(validation)),
        ..Default::default()
    };
    let context = UpstreamTlsContext { common_tls_context: Some(common), sni: host.to_string(), ..Default::default() };
    tls_socket(any(context))
}

/// Why a gateway server's TLS cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ServerTlsError {
    /// Not a terminating mode.
    #[error("TLS mode {0} does not terminate TLS")]
    NotTerminated(String),
    /// Neither certificate files nor a credential.
    #[error("no serverCertificate/privateKey or credentialName")]
    NoCertificate,
}

/// The downstream TLS socket of a gateway server terminating TLS (SIMPLE, MUTUAL,
/// OPTIONAL_MUTUAL, ISTIO_MUTUAL). `credentialName` is referenced as `kubernetes://NAME` over ADS; whether
/// the secret exists is the caller's concern.
pub(super) fn downstream_transport_socket(
    tls: &ServerTlsSettings,
    alpn: &[&str],
) -> Result<TransportSocket, ServerTlsError> {
    let mode = tls.mode.as_deref().unwrap_or("PASSTHROUGH");
    if mode == "ISTIO_MUTUAL" {
        // The gateway's own workload certificate, clients verified against the mesh root.
        return Ok(istio_mutual_server_socket(alpn, &tls.subject_alt_names));
    }
    if !matches!(mode, "SIMPLE" | "MUTUAL" | "OPTIONAL_MUTUAL") {
        return Err(ServerTlsError::NotTerminated(mode.to_string()));
    }
    let mutual = matches!(mode, "MUTUAL" | "OPTIONAL_MUTUAL");
    let credential = (!tls.credential_name.is_empty()).then(|| credential_resource_name(&tls.credential_name));
    let certificate = match &credential {
        Some(name) => ads_secret(name),
        None => key_pair(&tls.server_certificate, &tls.private_key).ok_or(ServerTlsError::NoCertificate)?,
    };
    let mut common = CommonTlsContext {
        tls_certificate_sds_secret_configs: vec![certificate],
        alpn_protocols: alpn.iter().map(|p| p.to_string()).collect(),
        tls_params: tls_params(tls),
        ..Default::default()
    };
    if mutual {
        let root = match &credential {
            Some(name) => Some(ads_secret(&format!("{name}{CA_SUFFIX}"))),
            None => (!tls.ca_certificates.is_empty()).then(|| agent_secret(&file_root_name(&tls.ca_certificates))),
        };
        if let Some(root) = root {
            let mut defaults = validation_defaults(&tls.ca_crl, &tls.subject_alt_names);
            defaults.verify_certificate_spki = tls.verify_certificate_spki.clone();
            defaults.verify_certificate_hash = tls.verify_certificate_hash.clone();
            common.validation_context_type = Some(combined(defaults, root));
        }
    }
    let context = DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(bool_value(mode == "MUTUAL")),
        ..Default::default()
    };
    Ok(tls_socket(any(context)))
}

/// The SDS reference of a certificate and key at paths on the proxy.
fn key_pair(chain: &str, key: &str) -> Option<SdsSecretConfig> {
    (!chain.is_empty() && !key.is_empty()).then(|| agent_secret(&file_cert_name(chain, key)))
}

/// SAN checks (and a CRL file, as Istio sends it) beside an SDS root.
fn validation_defaults(crl: &str, sans: &[String]) -> CertificateValidationContext {
    CertificateValidationContext { crl: (!crl.is_empty()).then(|| file(crl)), ..exact_sans(sans) }
}

fn combined(defaults: CertificateValidationContext, root: SdsSecretConfig) -> ValidationContextType {
    ValidationContextType::CombinedValidationContext(CombinedCertificateValidationContext {
        default_validation_context: Some(defaults),
        validation_context_sds_secret_config: Some(root),
        ..Default::default()
    })
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
