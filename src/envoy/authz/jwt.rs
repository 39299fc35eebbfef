//! RequestAuthentication as Envoy's `jwt_authn` filter, with Istio's semantics: a request without
//! a token passes (authorization decides, e.g. `requestPrincipals: ["*"]` requires one), a request
//! with a token no rule verifies is rejected (401). The verified payload goes into dynamic metadata,
//! where the RBAC filters' `requestPrincipals` and `request.auth.*` matchers read it.
//!
//! `jwksUri` keys are fetched by Envoy (`remote_jwks`) through a cluster generated for the URI's
//! host and port; an `https` URI gets TLS verified against the system CA bundle and the host name.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::{cluster, Cluster};
use envoy_types::pb::envoy::config::core::v3::{data_source, http_uri, DataSource, HttpUri};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, LocalityLbEndpoints};
use envoy_types::pb::envoy::config::route::v3::{route_match, RouteMatch};
use envoy_types::pb::envoy::extensions::clusters::common::dns::v3::DnsLookupFamily;
use envoy_types::pb::envoy::extensions::clusters::dns::v3::DnsCluster;
use envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::{
    jwt_provider::JwksSourceSpecifier, jwt_requirement::RequiresType, requirement_rule::RequirementType,
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement, JwtRequirementOrList, RemoteJwks,
    RequirementRule,
};
use envoy_types::pb::google::protobuf::Empty;

use super::matchers::PAYLOAD_KEY;
use crate::config::api::request_authentication::JwtRule;
use crate::config::api::RequestAuthentication;
use crate::config::validation::{parse_jwks_uri, JwksUri};
use crate::envoy::endpoint::lb_endpoint;
use crate::envoy::proto::{any, duration, map_field, resource};
use crate::envoy::tls::system_trusted_upstream_socket;
use crate::envoy::Resource;
use crate::mesh::MeshConfig;

/// How long Envoy waits for a JWKS fetch when the rule sets no timeout (Istio's default).
const DEFAULT_JWKS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How long fetched keys are cached (Istio's default refresh interval).
const JWKS_CACHE: std::time::Duration = std::time::Duration::from_secs(20 * 60);

/// CA bundle `https` JWKS servers are verified against.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// DNS cluster extension name.
const DNS_CLUSTER: &str = "envoy.clusters.dns";

/// The `jwt_authn` config for the rules of `policies`; `None` when there are none.
pub(super) fn jwt_authentication(policies: &[&RequestAuthentication]) -> Option<JwtAuthentication> {
    let rules: Vec<&JwtRule> = policies.iter().flat_map(|p| p.jwt_rules.iter()).collect();
    if rules.is_empty() {
        return None;
    }
    let mut providers = Vec::new();
    let mut requires = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.push((name.clone(), provider(rule)));
        requires.push(JwtRequirement { requires_type: Some(RequiresType::ProviderName(name)) });
    }
    // Istio: a missing token passes, an invalid one fails.
    requires.push(JwtRequirement { requires_type: Some(RequiresType::AllowMissing(Empty {})) });
    let rule = RequirementRule {
        r#match: Some(RouteMatch {
            path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
            ..Default::default()
        }),
        requirement_type: Some(RequirementType::Requires(JwtRequirement {
            requires_type: Some(RequiresType::RequiresAny(JwtRequirementOrList { requirements: requires })),
        })),
    };
    // One process-wide hasher: the same providers encode to the same bytes (and content hash).
    let providers = map_field(providers);
    Some(JwtAuthentication { providers, rules: vec![rule], bypass_cors_preflight: true, ..Default::default() })
}

fn provider(rule: &JwtRule) -> JwtProvider {
    let jwks = if !rule.jwks.is_empty() {
        Some(JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(rule.jwks.clone())),
            ..Default::default()
        }))
    } else {
        parse_jwks_uri(&rule.jwks_uri).ok().map(|uri| {
            let timeout = rule.timeout.map(|t| t.as_std()).unwrap_or(DEFAULT_JWKS_TIMEOUT);
            JwksSourceSpecifier::RemoteJwks(RemoteJwks {
                http_uri: Some(HttpUri {
                    uri: rule.jwks_uri.clone(),
                    timeout: Some(duration(timeout)),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(jwks_cluster_name(&uri))),
                }),
                cache_duration: Some(duration(JWKS_CACHE)),
                ..Default::default()
            })
        })
    };
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader { name: h.name.clone(), value_prefix: h.prefix.clone() })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: PAYLOAD_KEY.to_string(),
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        jwks_source_specifier: jwks,
        ..Default::default()
    }
}

/// The cluster remote keys of `uri` are fetched through.
fn jwks_cluster_name(uri: &JwksUri) -> String {
    format!("jwks|{}|{}|{}", if uri.tls { "https" } else { "http" }, uri.port, uri.host)
}

/// The clusters the `jwksUri`s of `policies` need, one per scheme, host and port.
pub(super) fn jwks_clusters(policies: &[&RequestAuthentication], mesh: &MeshConfig) -> Vec<Resource> {
    let uris: BTreeMap<String, JwksUri> = policies
        .iter()
        .flat_map(|p| p.jwt_rules.iter())
        .filter(|r| r.jwks.is_empty())
        .filter_map(|r| parse_jwks_uri(&r.jwks_uri).ok())
        .map(|u| (jwks_cluster_name(&u), u))
        .collect();
    uris.into_iter().map(|(name, uri)| resource(name.clone(), jwks_cluster(name, &uri, mesh))).collect()
}

fn jwks_cluster(name: String, uri: &JwksUri, mesh: &MeshConfig) -> Cluster {
    let is_ip = uri.host.parse::<std::net::IpAddr>().is_ok();
    let discovery = if is_ip {
        cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Static as i32)
    } else {
        let dns = DnsCluster {
            dns_refresh_rate: Some(duration(mesh.dns_refresh_rate.as_std())),
            respect_dns_ttl: true,
            dns_lookup_family: DnsLookupFamily::V4Preferred as i32,
            ..Default::default()
        };
        cluster::ClusterDiscoveryType::ClusterType(cluster::CustomClusterType {
            name: DNS_CLUSTER.to_string(),
            typed_config: Some(any(dns)),
        })
    };
    let transport_socket = uri.tls.then(|| system_trusted_upstream_socket(&uri.host, SYSTEM_CA_BUNDLE));
    Cluster {
        name: name.clone(),
        cluster_discovery_type: Some(discovery),
        connect_timeout: Some(duration(mesh.connect_timeout.as_std())),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name,
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![lb_endpoint(&uri.host, uri.port, 1)],
                ..Default::default()
            }],
            ..Default::default()
        }),
        transport_socket,
        ..Default::default()
    }
}
