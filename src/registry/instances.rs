//! Service instances by address: which services' endpoints carry an IP, so a proxy's own services
//! (its inbound side) are found from the IPs it reports.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::{Endpoint, Endpoints, Registry, Service};

/// Endpoints indexed by IP address. Built once per registry; entries share the registry's
/// services and endpoint lists (no copies).
#[derive(Debug, Default)]
pub struct InstanceIndex {
    by_ip: HashMap<IpAddr, Vec<(Arc<Service>, Endpoints, usize)>>,
}

impl InstanceIndex {
    /// Indexes every endpoint of `registry` whose address is an IP.
    pub fn new(registry: &Registry) -> InstanceIndex {
        let mut by_ip: HashMap<IpAddr, Vec<(Arc<Service>, Endpoints, usize)>> = HashMap::new();
        for (key, endpoints) in &registry.endpoints {
            let Some(service) = registry.services.get(key) else { continue };
            for (i, ep) in endpoints.iter().enumerate() {
                if let Ok(ip) = ep.address.parse::<IpAddr>() {
                    by_ip.entry(ip).or_default().push((service.clone(), endpoints.clone(), i));
                }
            }
        }
        InstanceIndex { by_ip }
    }

    /// The services (in key order) with an endpoint at `ip`, each with that endpoint.
    pub fn at(&self, ip: &str) -> Vec<(&Arc<Service>, &Endpoint)> {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return Vec::new();
        };
        self.by_ip
            .get(&ip)
            .into_iter()
            .flatten()
            .filter_map(|(service, endpoints, i)| Some((service, endpoints.get(*i)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ConfigKey, Kind};
    use crate::registry::{Hostname, Resolution, ServiceKey, ServiceOrigin, Visibility};

    fn endpoint(address: &str) -> Endpoint {
        Endpoint::at(address.into())
    }

    #[test]
    fn finds_the_services_of_an_address_in_any_spelling() {
        let mut registry = Registry::default();
        for (host, addresses) in
            [("a.example", vec!["10.0.0.1", "fd00::1"]), ("b.example", vec!["10.0.0.1", "db.internal"])]
        {
            let key = ServiceKey { hostname: Hostname::new(host), namespace: "ns".into() };
            let service = Service {
                hostname: Hostname::new(host),
                namespace: "ns".into(),
                ports: Vec::new(),
                addresses: Vec::new(),
                resolution: Resolution::Static,
                mesh_external: false,
                visibility: Visibility::from_export_to(&[], "ns", &[]),
                origin: ServiceOrigin::Config(ConfigKey {
                    kind: Kind::ServiceEntry,
                    namespace: "ns".into(),
                    name: host.into(),
                }),
                subject_alt_names: Vec::new(),
                alias_of: None,
            };
            registry.services.insert(key.clone(), Arc::new(service));
            registry.endpoints.insert(key, Arc::new(addresses.into_iter().map(endpoint).collect()));
        }
        let index = InstanceIndex::new(&registry);
        let hosts = |ip: &str| index.at(ip).iter().map(|(s, _)| s.hostname.to_string()).collect::<Vec<_>>();
        assert_eq!(hosts("10.0.0.1"), ["a.example", "b.example"]);
        assert_eq!(hosts("fd00:0::1"), ["a.example"]);
        assert!(hosts("10.0.0.2").is_empty());
        assert!(hosts("db.internal").is_empty(), "hostnames are not instances");
    }
}
