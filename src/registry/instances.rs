//! Service instances by address: which services' endpoints carry an IP, so a proxy's own services
//! (its inbound side) are found from the IPs it reports.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::{Endpoint, Registry, Service, ServiceKey};

/// Endpoints indexed by IP address (canonical text form). Built once per registry.
#[derive(Debug, Default)]
pub struct InstanceIndex {
    by_ip: HashMap<String, Vec<(ServiceKey, usize)>>,
}

impl InstanceIndex {
    /// Indexes every endpoint of `registry` whose address is an IP.
    pub fn new(registry: &Registry) -> InstanceIndex {
        let mut by_ip: HashMap<String, Vec<(ServiceKey, usize)>> = HashMap::new();
        for (key, endpoints) in &registry.endpoints {
            for (i, ep) in endpoints.iter().enumerate() {
                if let Ok(ip) = ep.address.parse::<IpAddr>() {
                    by_ip.entry(ip.to_string()).or_default().push((key.clone(), i));
                }
            }
        }
        InstanceIndex { by_ip }
    }

    /// The services (in key order) with an endpoint at `ip`, each with that endpoint.
    pub fn at<'a>(&self, registry: &'a Registry, ip: &str) -> Vec<(&'a Arc<Service>, &'a Endpoint)> {
        let Ok(ip) = ip.parse::<IpAddr>() else {
            return Vec::new();
        };
        let Some(found) = self.by_ip.get(&ip.to_string()) else {
            return Vec::new();
        };
        found
            .iter()
            .filter_map(|(key, i)| Some((registry.services.get(key)?, registry.endpoints.get(key)?.get(*i)?)))
            .collect()
    }
}
