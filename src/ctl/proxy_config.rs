//! `meshpilot proxy-config clusters|listeners|routes|endpoints|secrets|all PROXY`: the config
//! meshpilot generated for one proxy, as istioctl's tables (`-o short`) or Envoy's JSON/YAML. The
//! dump comes from the node's `/debug/config_dump`, or from whichever frontend of its membership
//! holds the proxy's stream.

use envoy_types::pb::envoy::admin::v3::{
    ClustersConfigDump, ConfigDump, EndpointsConfigDump, ListenersConfigDump, RoutesConfigDump, SecretsConfigDump,
};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use serde_json::Value;

use super::admin_client::{get_json, members};
use super::config_tables::{self, Filters};
use super::{xds_client, CtlError};
use crate::admin::envoy_json::{from_json, to_json};
use crate::xds::CONFIG_DUMP;

/// Which part of the config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConfigKind {
    /// CDS.
    Clusters,
    /// LDS.
    Listeners,
    /// RDS.
    Routes,
    /// EDS.
    Endpoints,
    /// SDS secrets served by meshpilot.
    Secrets,
    /// Everything.
    All,
}

/// How it is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// istioctl's tables.
    Short,
    /// Envoy's JSON of the resources.
    Json,
    /// The same as YAML.
    Yaml,
}

/// The resources of a dump, decoded.
#[derive(Debug, Default)]
pub struct Resources {
    /// Clusters.
    pub clusters: Vec<Cluster>,
    /// Listeners.
    pub listeners: Vec<Listener>,
    /// Route configurations.
    pub routes: Vec<RouteConfiguration>,
    /// Endpoint assignments.
    pub endpoints: Vec<ClusterLoadAssignment>,
    /// Secrets, by name (their material is never shown).
    pub secrets: Vec<String>,
}

/// The `ConfigDump` of `proxy` (node id or `pod.namespace`) from the node at `admin_url`, or
/// from the frontend of its membership that serves the proxy.
pub async fn fetch(admin_url: &str, proxy: &str) -> Result<ConfigDump, CtlError> {
    if proxy.is_empty() || proxy.chars().any(|c| c.is_control() || c == '&' || c == '#') {
        return Err(CtlError::Argument(format!("{proxy:?} is not a proxy name (node id or pod.namespace)")));
    }
    let local = get_json(admin_url, &format!("/debug/config_dump?proxyID={proxy}")).await;
    let local_error = match local {
        Ok(json) => {
            return from_json::<ConfigDump>(&json)
                .map_err(|e| CtlError::Admin { url: admin_url.to_string(), why: e.to_string() })
        }
        Err(e) => e,
    };
    let members = members(admin_url).await;
    for member in &members {
        if let Ok(answer) = xds_client::debug_request(&member.addr, CONFIG_DUMP, &[proxy.to_string()]).await {
            if !answer.resources.is_empty() {
                return Ok(ConfigDump { configs: answer.resources });
            }
        }
    }
    if members.is_empty() {
        Err(local_error)
    } else {
        Err(CtlError::UnknownProxy(proxy.to_string()))
    }
}

/// The resources of `dump`, decoded; a section that does not decode is an error.
pub fn resources(dump: &ConfigDump) -> Result<Resources, CtlError> {
    let mut out = Resources::default();
    for section in &dump.configs {
        if section.type_url == ClustersConfigDump::type_url() {
            let s: ClustersConfigDump = decode(section)?;
            out.clusters.extend(unpack_all(s.dynamic_active_clusters.iter().filter_map(|c| c.cluster.as_ref()))?);
        } else if section.type_url == ListenersConfigDump::type_url() {
            let s: ListenersConfigDump = decode(section)?;
            let active = s.dynamic_listeners.iter().filter_map(|l| l.active_state.as_ref()?.listener.as_ref());
            out.listeners.extend(unpack_all(active)?);
        } else if section.type_url == RoutesConfigDump::type_url() {
            let s: RoutesConfigDump = decode(section)?;
            out.routes.extend(unpack_all(s.dynamic_route_configs.iter().filter_map(|r| r.route_config.as_ref()))?);
        } else if section.type_url == EndpointsConfigDump::type_url() {
            let s: EndpointsConfigDump = decode(section)?;
            let configs = s.dynamic_endpoint_configs.iter().filter_map(|e| e.endpoint_config.as_ref());
            out.endpoints.extend(unpack_all(configs)?);
        } else if section.type_url == SecretsConfigDump::type_url() {
            let s: SecretsConfigDump = decode(section)?;
            out.secrets.extend(s.dynamic_active_secrets.into_iter().map(|d| d.name));
        }
    }
    Ok(out)
}

/// What `proxy-config KIND` prints of `dump`.
pub fn render(dump: &ConfigDump, kind: ConfigKind, filters: &Filters, output: Output) -> Result<String, CtlError> {
    let r = resources(dump)?;
    if output == Output::Short {
        let tables = match kind {
            ConfigKind::Clusters => vec![config_tables::clusters(&r.clusters, filters)],
            ConfigKind::Listeners => vec![config_tables::listeners(&r.listeners, filters)],
            ConfigKind::Routes => vec![config_tables::routes(&r.routes)],
            ConfigKind::Endpoints => vec![config_tables::endpoints(&r.endpoints, filters)],
            ConfigKind::Secrets => vec![config_tables::secrets(&r.secrets)],
            ConfigKind::All => vec![
                config_tables::clusters(&r.clusters, filters),
                config_tables::listeners(&r.listeners, filters),
                config_tables::routes(&r.routes),
                config_tables::endpoints(&r.endpoints, filters),
                config_tables::secrets(&r.secrets),
            ],
        };
        return Ok(tables.join("\n"));
    }
    let json = match kind {
        ConfigKind::Clusters => json_list(r.clusters.iter().filter(|c| filters.cluster(&c.name)))?,
        ConfigKind::Listeners => json_list(r.listeners.iter().filter(|l| filters.listener(l)))?,
        ConfigKind::Routes => json_list(r.routes.iter())?,
        ConfigKind::Endpoints => json_list(r.endpoints.iter().filter(|e| filters.cluster(&e.cluster_name)))?,
        ConfigKind::Secrets => Value::from(r.secrets.clone()),
        ConfigKind::All => to_json(dump).map_err(|e| CtlError::Argument(e.to_string()))?,
    };
    match output {
        Output::Yaml => serde_saphyr::to_string(&json).map_err(|e| CtlError::Argument(format!("writing YAML: {e}"))),
        _ => serde_json::to_string_pretty(&json).map(|s| s + "\n").map_err(|e| CtlError::Argument(e.to_string())),
    }
}

fn json_list<'a, M: Message + Name + 'a>(items: impl Iterator<Item = &'a M>) -> Result<Value, CtlError> {
    items
        .map(|m| to_json(m).map_err(|e| CtlError::Argument(e.to_string())))
        .collect::<Result<Vec<_>, _>>()
        .map(Value::from)
}

fn decode<M: Message + Default>(any: &Any) -> Result<M, CtlError> {
    M::decode(any.value.as_slice()).map_err(|e| CtlError::Argument(format!("{} does not decode: {e}", any.type_url)))
}

fn unpack_all<'a, M: Message + Default>(anys: impl Iterator<Item = &'a Any>) -> Result<Vec<M>, CtlError> {
    anys.map(decode).collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::envoy::generate;
    use crate::envoy::testing::{router, sidecar, snapshot, testdata};
    use crate::envoy::ProxyView;
    use crate::xds::Generated;
    use crate::xds::TypeUrl;
    use crate::xds::{config_dump, DumpedType};

    /// The dump of what the bookinfo mesh generates for `view`.
    fn bookinfo_dump(view: &ProxyView) -> ConfigDump {
        let yaml = std::fs::read_to_string(testdata().join("bookinfo.yaml")).expect("read bookinfo.yaml");
        let snap = snapshot(&yaml);
        let generated: Vec<(TypeUrl, Generated)> =
            TypeUrl::PUSH_ORDER.into_iter().map(|t| (t, Generated::from_resources(generate(t, &snap, view)))).collect();
        let types: Vec<DumpedType<'_>> =
            generated.iter().map(|(t, g)| DumpedType { type_url: *t, generated: g, status: None }).collect();
        config_dump(&types)
    }

    /// Compares with `src/ctl/testdata/NAME`; `UPDATE_GOLDEN=1` rewrites it.
    fn check_golden(name: &str, actual: &str) {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/ctl/testdata").join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, actual).expect("write golden file");
            return;
        }
        let expected = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(expected == actual, "{} differs (UPDATE_GOLDEN=1 accepts):\n{actual}", path.display());
    }

    #[test]
    fn sidecar_tables_golden() {
        let dump = bookinfo_dump(&sidecar("bookinfo", &[("app", "productpage")]));
        let all = render(&dump, ConfigKind::All, &Filters::default(), Output::Short).expect("renders");
        check_golden("sidecar-all.txt", &all);
    }

    #[test]
    fn gateway_tables_golden() {
        let dump = bookinfo_dump(&router("bookinfo", &[("istio", "ingressgateway")]));
        let all = render(&dump, ConfigKind::All, &Filters::default(), Output::Short).expect("renders");
        check_golden("gateway-all.txt", &all);
    }

    #[test]
    fn cluster_filters_match_as_istioctls() {
        let dump = bookinfo_dump(&sidecar("bookinfo", &[("app", "productpage")]));
        let filters = Filters {
            fqdn: Some("reviews".into()),
            port: Some(9080),
            subset: Some("v2".into()),
            direction: Some("outbound".into()),
        };
        let table = render(&dump, ConfigKind::Clusters, &filters, Output::Short).expect("renders");
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2, "{table}");
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells, ["reviews.bookinfo.svc.cluster.local", "9080", "v2", "outbound", "EDS", "-"], "{table}");
    }

    #[test]
    fn json_and_yaml_are_envoys_fields() {
        let dump = bookinfo_dump(&sidecar("bookinfo", &[("app", "productpage")]));
        let filters = Filters { fqdn: Some("reviews".into()), subset: Some("v1".into()), ..Default::default() };
        let json = render(&dump, ConfigKind::Clusters, &filters, Output::Json).expect("renders");
        let clusters: Value = serde_json::from_str(&json).expect("JSON");
        assert_eq!(clusters[0]["name"], "outbound|9080|v1|reviews.bookinfo.svc.cluster.local", "{json}");
        assert_eq!(clusters[0]["type"], "EDS");
        let yaml = render(&dump, ConfigKind::Clusters, &filters, Output::Yaml).expect("renders");
        assert!(yaml.contains("name: outbound|9080|v1|reviews.bookinfo.svc.cluster.local"), "{yaml}");
    }
}
