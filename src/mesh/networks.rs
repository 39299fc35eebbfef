//! Istio's MeshNetworks (the `meshNetworks` key of the `istio` ConfigMap): which endpoints belong
//! to which network, and the gateways that reach each network.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::Deserialize;

/// MeshNetworks: networks by name.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MeshNetworks {
    /// Networks by name.
    #[serde(default)]
    pub networks: BTreeMap<String, Network>,
}

/// One network.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Network {
    /// Which endpoints are in it.
    #[serde(default)]
    pub endpoints: Vec<NetworkEndpoints>,
    /// Gateways that reach it from other networks.
    #[serde(default)]
    pub gateways: Vec<NetworkGateway>,
}

/// Endpoints of a network: those of a registry (cluster), or those in a CIDR.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkEndpoints {
    /// A registry (cluster id).
    pub from_registry: Option<String>,
    /// A CIDR.
    pub from_cidr: Option<String>,
}

/// A gateway into a network: an address or a registry service, and a port.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkGateway {
    /// Gateway service hostname.
    pub registry_service_name: Option<String>,
    /// Gateway address.
    pub address: Option<String>,
    /// Gateway port.
    pub port: u32,
    /// Locality of the gateway.
    #[serde(default)]
    pub locality: String,
}

impl MeshNetworks {
    /// Parses and validates MeshNetworks YAML: the first problem as (field path, reason).
    pub fn parse(text: &str) -> Result<MeshNetworks, (String, String)> {
        if text.trim().is_empty() {
            return Ok(MeshNetworks::default());
        }
        let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|e| (String::new(), e.to_string()))?;
        let networks: MeshNetworks =
            serde_path_to_error::deserialize(value).map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
        networks.validate()?;
        Ok(networks)
    }

    fn validate(&self) -> Result<(), (String, String)> {
        for (name, network) in &self.networks {
            let at = |field: String| format!("networks.{name}.{field}");
            for (i, e) in network.endpoints.iter().enumerate() {
                match (&e.from_registry, &e.from_cidr) {
                    (Some(_), None) => {}
                    (None, Some(cidr)) => check_cidr(cidr).map_err(|r| (at(format!("endpoints[{i}].fromCidr")), r))?,
                    _ => {
                        return Err((at(format!("endpoints[{i}]")), "exactly one of fromRegistry and fromCidr".into()))
                    }
                }
            }
            for (i, g) in network.gateways.iter().enumerate() {
                if g.registry_service_name.is_some() == g.address.is_some() {
                    return Err((
                        at(format!("gateways[{i}]")),
                        "exactly one of registryServiceName and address".into(),
                    ));
                }
                if !(1..=65535).contains(&g.port) {
                    return Err((at(format!("gateways[{i}].port")), format!("{} is not a port (1-65535)", g.port)));
                }
            }
        }
        Ok(())
    }
}

fn check_cidr(cidr: &str) -> Result<(), String> {
    let (ip, len) = cidr.split_once('/').ok_or_else(|| format!("{cidr:?} is not a CIDR (ADDRESS/LENGTH)"))?;
    let ip: IpAddr = ip.parse().map_err(|_| format!("{ip:?} is not an IP address"))?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match len.parse::<u8>() {
        Ok(l) if l <= max => Ok(()),
        _ => Err(format!("prefix length {len:?} is not 0-{max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_istio_mesh_networks() {
        let n = MeshNetworks::parse(
            "networks:\n  net1:\n    endpoints: [{fromRegistry: Kubernetes}]\n    gateways: [{address: 1.2.3.4, port: 15443}]\n  net2:\n    endpoints: [{fromCidr: 10.1.0.0/16}]\n    gateways: [{registryServiceName: istio-eastwestgateway.istio-system.svc.cluster.local, port: 15443}]\n",
        )
        .unwrap();
        assert_eq!(n.networks.len(), 2);
        assert_eq!(n.networks["net2"].endpoints[0].from_cidr.as_deref(), Some("10.1.0.0/16"));
    }

    #[test]
    fn problems_have_field_paths() {
        let bad = |text: &str| MeshNetworks::parse(text).unwrap_err();
        assert_eq!(bad("networks: {n: {endpoints: [{fromCidr: 10.0.0.0/33}]}}").0, "networks.n.endpoints[0].fromCidr");
        assert_eq!(bad("networks: {n: {endpoints: [{}]}}").0, "networks.n.endpoints[0]");
        assert_eq!(bad("networks: {n: {gateways: [{address: a, port: 0}]}}").0, "networks.n.gateways[0].port");
        assert_eq!(bad("networks: {n: {gatways: []}}").0, "networks.n.gatways");
    }
}
