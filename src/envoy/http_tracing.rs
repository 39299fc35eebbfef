//! The `tracing` block of every HTTP connection manager, as istiod writes it from MeshConfig
//! (`enableTracing`) and the proxy's ProxyConfig `tracing` when no Telemetry resource says
//! otherwise: sampling, Istio's own span tags and the configured custom tags. The tracer (its
//! provider) stays the bootstrap's.

use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::Tracing;
use envoy_types::pb::envoy::r#type::metadata::v3::{
    metadata_key::{path_segment::Segment, PathSegment},
    metadata_kind, MetadataKey, MetadataKind,
};
use envoy_types::pb::envoy::r#type::tracing::v3::{custom_tag, CustomTag as EnvoyTag};
use envoy_types::pb::envoy::r#type::v3::Percent;

use super::names::ext::HTTP_RBAC;
use super::proto::u32_value;
use super::proxy::{ProxyView, TraceIdentity};
use crate::mesh::{CustomTag, MeshConfig, ProxyTracing};

/// pilot's `PILOT_TRACE_SAMPLING` default: the percentage sampled when no ProxyConfig says.
const DEFAULT_SAMPLING: f64 = 1.0;

/// The dry-run AuthorizationPolicy tags: which shadow policy matched and what it decided, read
/// from the RBAC filter's metadata (empty where no dry-run policy applies).
const DRY_RUN_TAGS: [(&str, &str); 4] = [
    ("istio.authorization.dry_run.allow_policy.name", "istio_dry_run_allow_shadow_effective_policy_id"),
    ("istio.authorization.dry_run.allow_policy.result", "istio_dry_run_allow_shadow_engine_result"),
    ("istio.authorization.dry_run.deny_policy.name", "istio_dry_run_deny_shadow_effective_policy_id"),
    ("istio.authorization.dry_run.deny_policy.result", "istio_dry_run_deny_shadow_engine_result"),
];

/// The tracing block of `view`'s connection managers: none when the mesh does not trace (the
/// view then carries no trace identity).
pub(super) fn hcm_tracing(mesh: &MeshConfig, view: &ProxyView) -> Option<Tracing> {
    let identity = view.trace.as_ref().filter(|_| mesh.enable_tracing)?;
    // A node's ProxyConfig replaces the mesh's default one whole, as istiod's ProxyConfigOrDefault.
    let settings = match &identity.node_tracing {
        Some(node) => Some(node),
        None => mesh.default_config.tracing.as_ref(),
    };
    let default = ProxyTracing::default();
    let settings = settings.unwrap_or(&default);
    let mut tags = Vec::new();
    if settings.enable_istio_tags.unwrap_or(true) {
        tags.extend(istio_tags(identity));
        tags.extend(DRY_RUN_TAGS.iter().map(|(tag, key)| dry_run_tag(tag, key)));
    }
    tags.extend(settings.custom_tags.iter().map(|(name, tag)| custom_tag(name, tag)));
    tags.sort_by(|a, b| a.tag.cmp(&b.tag));
    Some(Tracing {
        client_sampling: Some(Percent { value: 100.0 }),
        random_sampling: Some(Percent { value: sampling(settings) }),
        overall_sampling: Some(Percent { value: 100.0 }),
        max_path_tag_length: (settings.max_path_tag_length != 0).then(|| u32_value(settings.max_path_tag_length)),
        custom_tags: tags,
        ..Default::default()
    })
}

/// The ProxyConfig's sampling, pilot's default when unset; above 100 it is taken as 1%, as
/// istiod takes it.
fn sampling(settings: &ProxyTracing) -> f64 {
    let s = settings.sampling.0;
    if s == 0.0 {
        DEFAULT_SAMPLING
    } else if s > 100.0 {
        1.0
    } else {
        s
    }
}

fn istio_tags(identity: &TraceIdentity) -> [EnvoyTag; 5] {
    [
        ("istio.canonical_revision", &identity.canonical_revision),
        ("istio.canonical_service", &identity.canonical_service),
        ("istio.mesh_id", &identity.mesh_id),
        ("istio.namespace", &identity.namespace),
        ("istio.cluster_id", &identity.cluster_id),
    ]
    .map(|(tag, value)| literal(tag, value))
}

fn literal(tag: &str, value: &str) -> EnvoyTag {
    EnvoyTag {
        tag: tag.to_string(),
        r#type: Some(custom_tag::Type::Literal(custom_tag::Literal { value: value.to_string() })),
    }
}

fn dry_run_tag(tag: &str, key: &str) -> EnvoyTag {
    let metadata = custom_tag::Metadata {
        kind: Some(MetadataKind { kind: Some(metadata_kind::Kind::Request(metadata_kind::Request {})) }),
        metadata_key: Some(MetadataKey {
            key: HTTP_RBAC.to_string(),
            path: vec![PathSegment { segment: Some(Segment::Key(key.to_string())) }],
        }),
        default_value: String::new(),
    };
    EnvoyTag { tag: tag.to_string(), r#type: Some(custom_tag::Type::Metadata(metadata)) }
}

fn custom_tag(name: &str, tag: &CustomTag) -> EnvoyTag {
    let r#type = match tag {
        CustomTag::Literal { value } => custom_tag::Type::Literal(custom_tag::Literal { value: value.clone() }),
        CustomTag::Environment { name, default_value } => custom_tag::Type::Environment(custom_tag::Environment {
            name: name.clone(),
            default_value: default_value.clone(),
        }),
        CustomTag::Header { name, default_value } => custom_tag::Type::RequestHeader(custom_tag::Header {
            name: name.clone(),
            default_value: default_value.clone(),
        }),
    };
    EnvoyTag { tag: name.to_string(), r#type: Some(r#type) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::testing::sidecar;
    use crate::mesh::Sampling;

    fn traced(labels: &[(&str, &str)], node_tracing: Option<ProxyTracing>) -> ProxyView {
        let mut view = sidecar("shop", labels);
        view.trace = Some(TraceIdentity::new(&view.labels, "shop", "cluster.local", Some("Kubernetes"), node_tracing));
        view
    }

    fn tag_names(t: &Tracing) -> Vec<&str> {
        t.custom_tags.iter().map(|t| t.tag.as_str()).collect()
    }

    fn literal_of<'a>(t: &'a Tracing, name: &str) -> &'a str {
        match t.custom_tags.iter().find(|t| t.tag == name).and_then(|t| t.r#type.as_ref()) {
            Some(custom_tag::Type::Literal(l)) => &l.value,
            other => panic!("{name}: {other:?}"),
        }
    }

    #[test]
    fn istiod_defaults_sample_one_percent_with_istio_tags_sorted() {
        let view = traced(&[("service.istio.io/canonical-name", "orders")], None);
        let t = hcm_tracing(&MeshConfig::default(), &view).expect("the mesh traces by default");
        assert_eq!(t.random_sampling, Some(Percent { value: 1.0 }));
        assert_eq!(
            (t.client_sampling, t.overall_sampling),
            (Some(Percent { value: 100.0 }), Some(Percent { value: 100.0 }))
        );
        assert_eq!(t.max_path_tag_length, None);
        assert_eq!(
            tag_names(&t),
            [
                "istio.authorization.dry_run.allow_policy.name",
                "istio.authorization.dry_run.allow_policy.result",
                "istio.authorization.dry_run.deny_policy.name",
                "istio.authorization.dry_run.deny_policy.result",
                "istio.canonical_revision",
                "istio.canonical_service",
                "istio.cluster_id",
                "istio.mesh_id",
                "istio.namespace",
            ]
        );
        assert_eq!(literal_of(&t, "istio.canonical_service"), "orders");
        assert_eq!(literal_of(&t, "istio.canonical_revision"), "latest");
        assert_eq!(literal_of(&t, "istio.cluster_id"), "Kubernetes");
    }

    #[test]
    fn no_tracing_when_the_mesh_disables_it_or_the_view_has_no_identity() {
        let mesh = MeshConfig { enable_tracing: false, ..MeshConfig::default() };
        assert_eq!(hcm_tracing(&mesh, &traced(&[], None)), None);
        assert_eq!(hcm_tracing(&MeshConfig::default(), &sidecar("shop", &[])), None);
    }

    #[test]
    fn the_nodes_proxy_config_replaces_the_meshs_default() {
        let mut mesh = MeshConfig::default();
        mesh.default_config.tracing = Some(ProxyTracing {
            sampling: Sampling(50.0),
            max_path_tag_length: 64,
            custom_tags: [("team".to_string(), CustomTag::Literal { value: "payments".into() })].into(),
            enable_istio_tags: Some(false),
        });
        let from_mesh = hcm_tracing(&mesh, &traced(&[], None)).unwrap();
        assert_eq!(from_mesh.random_sampling, Some(Percent { value: 50.0 }));
        assert_eq!(from_mesh.max_path_tag_length, Some(u32_value(64)));
        assert_eq!(tag_names(&from_mesh), ["team"], "Istio's tags are off");
        // A node that sent PROXY_CONFIG without tracing gets pilot's defaults, not the mesh's.
        let from_node = hcm_tracing(&mesh, &traced(&[], Some(ProxyTracing::default()))).unwrap();
        assert_eq!(from_node.random_sampling, Some(Percent { value: 1.0 }));
        assert_eq!(from_node.custom_tags.len(), 9);
        let over = ProxyTracing { sampling: Sampling(250.0), ..Default::default() };
        let from_node = hcm_tracing(&mesh, &traced(&[], Some(over))).unwrap();
        assert_eq!(from_node.random_sampling, Some(Percent { value: 1.0 }), "above 100 is taken as 1%, as istiod");
    }
}
