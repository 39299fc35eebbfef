//! SDS references: every certificate a generated TLS context uses is a secret Envoy fetches by
//! name, never a file path in the resource (a proxy lacking a file would reject the whole
//! update). Istio's names: `default` (the workload certificate) and `ROOTCA` (the mesh root),
//! `file-cert:CERT~KEY` and `file-root:CA` for certificates at paths on the proxy, all served by
//! pilot-agent on the bootstrap's `sds-grpc` cluster; `kubernetes://NAME` for a gateway's
//! `credentialName`, served by the control plane over ADS.

use envoy_types::pb::envoy::config::core::v3::{
    api_config_source::ApiType, config_source, grpc_service, ApiConfigSource, ApiVersion, ConfigSource, GrpcService,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::SdsSecretConfig;

use super::proto::{ads_config_source, zero_duration};

/// The cluster pilot-agent serves SDS on (defined by Istio's bootstrap template).
pub(super) const SDS_CLUSTER: &str = "sds-grpc";
/// The workload's own certificate.
pub(super) const WORKLOAD_CERT: &str = "default";
/// The mesh's root certificate.
pub(super) const ROOT_CA: &str = "ROOTCA";
/// Prefix of a gateway credential's resource name.
pub(crate) const KUBERNETES_PREFIX: &str = "kubernetes://";
/// Suffix Istio adds to a credential's name for its CA certificate.
pub(crate) const CA_SUFFIX: &str = "-cacert";

/// A secret served by pilot-agent on `sds-grpc`. The workload certificate and root wait for
/// as long as it takes (as Istio's): a listener without them must not start.
pub(super) fn agent_secret(name: &str) -> SdsSecretConfig {
    let builtin = name == WORKLOAD_CERT || name == ROOT_CA;
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            resource_api_version: ApiVersion::V3 as i32,
            initial_fetch_timeout: builtin.then(zero_duration),
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(ApiConfigSource {
                api_type: ApiType::Grpc as i32,
                transport_api_version: ApiVersion::V3 as i32,
                set_node_on_first_message_only: true,
                grpc_services: vec![GrpcService {
                    target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
                        cluster_name: SDS_CLUSTER.to_string(),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            })),
            ..Default::default()
        }),
    }
}

/// A secret the control plane serves over ADS (a gateway's `credentialName`). Envoy's default
/// initial fetch timeout applies, as in Istio: a missing secret holds its listener back for a
/// while, never the whole proxy for good.
pub(super) fn ads_secret(name: &str) -> SdsSecretConfig {
    let source = ConfigSource { initial_fetch_timeout: None, ..ads_config_source() };
    SdsSecretConfig { name: name.to_string(), sds_config: Some(source) }
}

/// Istio's resource name of a certificate and key at paths on the proxy.
pub(super) fn file_cert_name(cert: &str, key: &str) -> String {
    format!("file-cert:{cert}~{key}")
}

/// Istio's resource name of a CA certificate at a path on the proxy.
pub(super) fn file_root_name(ca: &str) -> String {
    format!("file-root:{ca}")
}

/// The resource name of a `credentialName` (Istio's `kubernetes://NAME`; a name already carrying
/// a scheme is kept).
pub(crate) fn credential_resource_name(credential: &str) -> String {
    if credential.contains("://") {
        credential.to_string()
    } else {
        format!("{KUBERNETES_PREFIX}{credential}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_istio() {
        assert_eq!(file_cert_name("/c.pem", "/k.pem"), "file-cert:/c.pem~/k.pem");
        assert_eq!(file_root_name("/ca.pem"), "file-root:/ca.pem");
        assert_eq!(credential_resource_name("web-cert"), "kubernetes://web-cert");
        assert_eq!(credential_resource_name("kubernetes://web-cert"), "kubernetes://web-cert");
        let default = agent_secret(WORKLOAD_CERT);
        assert_eq!(default.sds_config.as_ref().and_then(|c| c.initial_fetch_timeout), Some(zero_duration()));
        assert!(format!("{default:?}").contains("sds-grpc"));
        assert_eq!(agent_secret("file-root:/x").sds_config.and_then(|c| c.initial_fetch_timeout), None);
    }
}
