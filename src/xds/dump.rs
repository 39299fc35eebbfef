//! Envoy's admin `ConfigDump` of what meshpilot generated for one proxy: the messages Envoy's own
//! `/config_dump` holds once the proxy applied them, so the two can be diffed field by field.

use std::time::SystemTime;

use envoy_types::pb::envoy::admin::v3::{
    clusters_config_dump::DynamicCluster,
    endpoints_config_dump::DynamicEndpointConfig,
    listeners_config_dump::{DynamicListener, DynamicListenerState},
    routes_config_dump::DynamicRouteConfig,
    secrets_config_dump::DynamicSecret,
    ClustersConfigDump, ConfigDump, EndpointsConfigDump, ListenersConfigDump, RoutesConfigDump, SecretsConfigDump,
};
use envoy_types::pb::envoy::config::core::v3::{data_source, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{secret, Secret};
use envoy_types::pb::google::protobuf::{Any, Timestamp};
use prost::{Message, Name};

use super::cache::Generated;
use super::status::TypeStatus;
use super::TypeUrl;

/// What one type of a proxy's config holds: its generated resources and its sync state.
pub struct DumpedType<'a> {
    /// The type.
    pub type_url: TypeUrl,
    /// What the proxy's view generates for it now.
    pub generated: &'a Generated,
    /// What was sent and acknowledged on the proxy's stream (none before the first request).
    pub status: Option<&'a TypeStatus>,
}

/// The `ConfigDump` of one proxy, its sections in Envoy's order (clusters, listeners, routes,
/// secrets, endpoints); private keys are redacted as Envoy's own dump redacts them. Each section's `version_info` is the version the proxy last acknowledged, as in
/// Envoy's dump; resources carry it too, with the time of that acknowledgement.
pub fn config_dump(types: &[DumpedType<'_>]) -> ConfigDump {
    let section = |t: TypeUrl| types.iter().find(|d| d.type_url == t);
    let mut configs = Vec::new();
    for type_url in [TypeUrl::Cluster, TypeUrl::Listener, TypeUrl::Route, TypeUrl::Secret, TypeUrl::Endpoint] {
        let Some(dumped) = section(type_url) else { continue };
        let version = dumped.status.map(|s| s.acked_version.clone()).unwrap_or_default();
        let updated = dumped.status.and_then(|s| s.acked_at.or(s.sent_at)).map(timestamp);
        let resources = dumped.generated.resources.iter().map(|r| r.body.clone());
        configs.push(match type_url {
            TypeUrl::Cluster => pack(&ClustersConfigDump {
                version_info: version.clone(),
                dynamic_active_clusters: resources
                    .map(|cluster| DynamicCluster {
                        version_info: version.clone(),
                        cluster: Some(cluster),
                        last_updated: updated,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Listener => pack(&ListenersConfigDump {
                version_info: version.clone(),
                dynamic_listeners: dumped
                    .generated
                    .resources
                    .iter()
                    .map(|r| DynamicListener {
                        name: r.name.clone(),
                        active_state: Some(DynamicListenerState {
                            version_info: version.clone(),
                            listener: Some(r.body.clone()),
                            last_updated: updated,
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Route => pack(&RoutesConfigDump {
                dynamic_route_configs: resources
                    .map(|route_config| DynamicRouteConfig {
                        version_info: version.clone(),
                        route_config: Some(route_config),
                        last_updated: updated,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Secret => pack(&SecretsConfigDump {
                dynamic_active_secrets: dumped
                    .generated
                    .resources
                    .iter()
                    .map(|r| DynamicSecret {
                        name: r.name.clone(),
                        version_info: version.clone(),
                        last_updated: updated,
                        secret: Some(redacted(&r.body)),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            TypeUrl::Endpoint => pack(&EndpointsConfigDump {
                dynamic_endpoint_configs: resources
                    .map(|endpoint_config| DynamicEndpointConfig {
                        version_info: version.clone(),
                        endpoint_config: Some(endpoint_config),
                        last_updated: updated,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
        });
    }
    ConfigDump { configs }
}

/// A secret with its private material replaced by `[redacted]`, as Envoy dumps secrets;
/// certificates (public) stay. Anything that does not decode as a secret shows nothing.
fn redacted(any: &Any) -> Any {
    let hidden = || {
        Some(DataSource {
            specifier: Some(data_source::Specifier::InlineString("[redacted]".into())),
            ..Default::default()
        })
    };
    let Ok(mut s) = Secret::decode(any.value.as_slice()) else {
        return Any { type_url: any.type_url.clone(), value: Vec::new() };
    };
    match &mut s.r#type {
        Some(secret::Type::TlsCertificate(c)) => {
            if c.private_key.is_some() {
                c.private_key = hidden();
            }
            if c.password.is_some() {
                c.password = hidden();
            }
        }
        Some(secret::Type::GenericSecret(g)) => g.secret = hidden(),
        _ => {}
    }
    pack(&s)
}

fn pack<M: Message + Name>(message: &M) -> Any {
    Any { type_url: M::type_url(), value: message.encode_to_vec() }
}

/// `at` as a protobuf timestamp.
pub fn timestamp(at: SystemTime) -> Timestamp {
    let since = at.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    Timestamp { seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX), nanos: since.subsec_nanos() as i32 }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;

    use super::*;
    use crate::envoy::Resource;

    fn cluster(name: &str) -> Resource {
        let c = Cluster { name: name.into(), ..Default::default() };
        Resource { name: name.into(), body: Any { type_url: Cluster::type_url(), value: c.encode_to_vec() } }
    }

    #[test]
    fn sections_carry_the_acknowledged_version_and_every_resource() {
        let generated = Generated::from_resources(vec![cluster("b"), cluster("a")]);
        let status = TypeStatus {
            acked_version: "1.7".into(),
            acked_at: Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5)),
            ..Default::default()
        };
        let dump =
            config_dump(&[DumpedType { type_url: TypeUrl::Cluster, generated: &generated, status: Some(&status) }]);
        assert_eq!(dump.configs.len(), 1);
        assert_eq!(dump.configs[0].type_url, "type.googleapis.com/envoy.admin.v3.ClustersConfigDump");
        let clusters = ClustersConfigDump::decode(dump.configs[0].value.as_slice()).expect("decodes");
        assert_eq!(clusters.version_info, "1.7");
        let names: Vec<String> = clusters
            .dynamic_active_clusters
            .iter()
            .map(|c| Cluster::decode(c.cluster.as_ref().expect("cluster").value.as_slice()).expect("decodes").name)
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(clusters.dynamic_active_clusters[0].last_updated.map(|t| t.seconds), Some(5));
    }

    #[test]
    fn secrets_are_named_and_their_keys_never_shown() {
        let inline = |s: &str| DataSource {
            specifier: Some(data_source::Specifier::InlineBytes(s.as_bytes().to_vec())),
            ..Default::default()
        };
        let secret = Secret {
            name: "kubernetes://web".into(),
            r#type: Some(secret::Type::TlsCertificate(
                envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::TlsCertificate {
                    certificate_chain: Some(inline("CERT-PEM")),
                    private_key: Some(inline("PRIVATE-KEY-PEM")),
                    ..Default::default()
                },
            )),
        };
        let body = Any { type_url: Secret::type_url(), value: secret.encode_to_vec() };
        let generated = Generated::from_resources(vec![Resource { name: "kubernetes://web".into(), body }]);
        let dump = config_dump(&[DumpedType { type_url: TypeUrl::Secret, generated: &generated, status: None }]);
        let bytes = dump.encode_to_vec();
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("kubernetes://web") && text.contains("CERT-PEM") && text.contains("[redacted]"),
            "{text}"
        );
        assert!(!text.contains("PRIVATE-KEY-PEM"), "the private key leaked: {text}");
    }

    #[test]
    fn sections_follow_envoys_order() {
        let empty = Generated::from_resources(Vec::new());
        let types: Vec<DumpedType<'_>> = TypeUrl::PUSH_ORDER
            .into_iter()
            .map(|type_url| DumpedType { type_url, generated: &empty, status: None })
            .collect();
        let urls: Vec<String> = config_dump(&types).configs.into_iter().map(|c| c.type_url).collect();
        assert_eq!(
            urls,
            [
                "type.googleapis.com/envoy.admin.v3.ClustersConfigDump",
                "type.googleapis.com/envoy.admin.v3.ListenersConfigDump",
                "type.googleapis.com/envoy.admin.v3.RoutesConfigDump",
                "type.googleapis.com/envoy.admin.v3.SecretsConfigDump",
                "type.googleapis.com/envoy.admin.v3.EndpointsConfigDump",
            ]
        );
    }
}
