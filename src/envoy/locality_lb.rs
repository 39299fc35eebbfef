//! Locality load balancing as istiod applies it to a cluster's endpoints, relative to the proxy
//! that receives them: `distribute` weighs localities; failover (only with outlier detection,
//! which is what lets Envoy leave a priority) puts the proxy's own locality first and the rest by
//! distance (`failover` naming the region to try after one's own), or orders endpoints by how
//! many `failoverPriority` labels they share with the proxy.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::Locality;
use envoy_types::pb::envoy::config::endpoint::v3::LocalityLbEndpoints;

use super::proto::u32_value;
use crate::config::api::destination_rule::{LocalityDistribute, LocalityFailover, LocalityLbSetting};
use crate::config::api::Labels;
use crate::mesh::MeshConfig;
use crate::registry::Endpoint;

/// The labels naming a workload's region, zone and subzone, which a locality stands in for.
const TOPOLOGY: [&str; 3] =
    ["topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"];

/// One locality's endpoints as sent, with the registry endpoints they came from (same order).
pub(super) type Group<'a> = (LocalityLbEndpoints, Vec<&'a Endpoint>);

/// The proxy the endpoints are generated for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Client<'a> {
    /// Its locality (`region/zone/subzone`).
    pub locality: &'a str,
    /// Its labels (those some selector or failover priority reads).
    pub labels: &'a Labels,
}

/// The setting in force: the DestinationRule's, else the mesh's; none when switched off.
pub(super) fn effective<'a>(
    rule: Option<&'a LocalityLbSetting>,
    mesh: &'a MeshConfig,
) -> Option<&'a LocalityLbSetting> {
    rule.or(mesh.locality_lb_setting.as_ref()).filter(|s| s.is_enabled())
}

/// Whether the cluster weighs localities (Envoy's `locality_weighted_lb_config`): with
/// `distribute`, or with failover rules that outlier detection lets act.
pub(super) fn weighs_localities(setting: Option<&LocalityLbSetting>, outlier_detection: bool) -> bool {
    setting.is_some_and(|s| {
        !s.distribute.is_empty() || (outlier_detection && (!s.failover.is_empty() || !s.failover_priority.is_empty()))
    })
}

/// `groups` weighed or prioritized for `client` as `setting` says; `outlier_detection` enables
/// failover.
pub(super) fn apply(
    mut groups: Vec<Group<'_>>,
    setting: Option<&LocalityLbSetting>,
    outlier_detection: bool,
    client: Client<'_>,
) -> Vec<LocalityLbEndpoints> {
    let Some(setting) = setting else {
        return groups.into_iter().map(|(g, _)| g).collect();
    };
    let client_locality = parse(client.locality);
    if !setting.distribute.is_empty() {
        distribute(&mut groups, &setting.distribute, &client_locality);
    } else if outlier_detection {
        if !setting.failover_priority.is_empty() {
            groups = by_priority_labels(groups, &setting.failover_priority, client);
            if !setting.failover.is_empty() {
                failover(&mut groups, &setting.failover, &client_locality);
            }
        } else {
            failover(&mut groups, &setting.failover, &client_locality);
        }
    }
    groups.into_iter().map(|(g, _)| g).collect()
}

/// The first `distribute` rule whose `from` matches the client sets the localities' weights
/// (a locality's share split among the groups it matches, by their own weights); groups no
/// destination names keep their place but lose their endpoints.
fn distribute(groups: &mut [Group<'_>], rules: &[LocalityDistribute], client: &Locality) {
    let Some(rule) = rules.iter().find(|r| matches(client, &r.from)) else { return };
    let mut unmatched: Vec<bool> = vec![true; groups.len()];
    for (destination, &share) in &rule.to {
        let mut weights = BTreeMap::new();
        for (i, (group, _)) in groups.iter().enumerate() {
            if unmatched[i] && matches(group.locality.as_ref().unwrap_or(&Locality::default()), destination) {
                unmatched[i] = false;
                weights.insert(i, group.load_balancing_weight.map_or(1, |w| w.value));
            }
        }
        let total: u64 = weights.values().map(|w| u64::from(*w)).sum();
        for (i, weight) in weights {
            let scaled = (u64::from(weight) * u64::from(share)).div_ceil(total.max(1));
            if scaled > 0 {
                groups[i].0.load_balancing_weight = Some(u32_value(u32::try_from(scaled).unwrap_or(u32::MAX)));
            }
        }
    }
    for (i, (group, _)) in groups.iter_mut().enumerate() {
        if unmatched[i] {
            group.lb_endpoints.clear();
        }
    }
}

/// Priorities by distance from the client's locality (same subzone 0, zone 1, region 2, else 3;
/// 4 for a region other than the one `failover` names for the client's), composed with the
/// priorities already set, then numbered from 0 without gaps.
fn failover(groups: &mut [Group<'_>], rules: &[LocalityFailover], client: &Locality) {
    for (group, _) in groups.iter_mut() {
        let here = group.locality.clone().unwrap_or_default();
        let mut priority = distance(client, &here);
        if priority == 3 {
            if let Some(rule) = rules.iter().find(|r| r.from == client.region) {
                if here.region != rule.to {
                    priority = 4;
                }
            }
        }
        group.priority = group.priority * 5 + priority;
    }
    compact(groups);
}

/// Each group split by how many of the `labels` (most significant first) its endpoints share
/// with the client: all of them priority 0, none the lowest. A `label=value` compares with that
/// value instead of the client's; the network label, when first, is ignored on a mismatch.
fn by_priority_labels<'a>(groups: Vec<Group<'a>>, labels: &[String], client: Client<'_>) -> Vec<Group<'a>> {
    let client_locality = parse(client.locality);
    let lowest = labels.len();
    let network_first = labels.first().is_some_and(|l| l == "topology.istio.io/network");
    let mut out = Vec::new();
    for (group, endpoints) in groups {
        let mut levels: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (i, endpoint) in endpoints.iter().enumerate() {
            let (mut priority, mut adjust) = (0, 0);
            for (j, label) in labels.iter().enumerate() {
                let (key, wanted) = match label.split_once('=') {
                    Some((key, value)) => (key, Some(value.to_string())),
                    None => (label.as_str(), label_of(client.labels, &client_locality, label)),
                };
                let theirs = endpoint_label(endpoint, key);
                if wanted.as_deref().unwrap_or_default() != theirs.as_deref().unwrap_or_default() {
                    if j == 0 && network_first {
                        adjust = lowest;
                        continue;
                    }
                    priority = lowest - j;
                    break;
                }
            }
            levels.entry(priority + adjust).or_default().push(i);
        }
        for (priority, members) in levels {
            let mut split = group.clone();
            split.lb_endpoints = members.iter().map(|&i| group.lb_endpoints[i].clone()).collect();
            let weight = split.lb_endpoints.iter().map(|e| e.load_balancing_weight.map_or(0, |w| w.value)).sum();
            split.load_balancing_weight = Some(u32_value(weight));
            split.priority = u32::try_from(priority).unwrap_or(u32::MAX);
            out.push((split, members.iter().map(|&i| endpoints[i]).collect()));
        }
    }
    compact(&mut out);
    out
}

/// Renumbers the groups' priorities 0, 1, 2, ... in their order, keeping ties.
fn compact(groups: &mut [Group<'_>]) {
    let mut used: Vec<u32> = groups.iter().map(|(g, _)| g.priority).collect();
    used.sort_unstable();
    used.dedup();
    for (group, _) in groups.iter_mut() {
        group.priority = u32::try_from(used.partition_point(|p| *p < group.priority)).unwrap_or(u32::MAX);
    }
}

/// How far `there` is from `here`: 0 same subzone, 1 same zone, 2 same region, 3 elsewhere.
fn distance(here: &Locality, there: &Locality) -> u32 {
    match (here.region == there.region, here.zone == there.zone, here.sub_zone == there.sub_zone) {
        (true, true, true) => 0,
        (true, true, false) => 1,
        (true, false, _) => 2,
        (false, _, _) => 3,
    }
}

/// Whether `locality` is within `rule` (`region/zone/subzone`, `*` or an absent part matching
/// any; the region must be given).
fn matches(locality: &Locality, rule: &str) -> bool {
    let mut parts = rule.splitn(3, '/');
    let (region, zone, sub_zone) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let part = |rule: &str, value: &str, optional: bool| rule == "*" || (optional && rule.is_empty()) || rule == value;
    part(region, &locality.region, false)
        && part(zone, &locality.zone, true)
        && part(sub_zone, &locality.sub_zone, true)
}

/// A client's label, its locality standing in for the topology labels it lacks.
fn label_of(labels: &Labels, locality: &Locality, key: &str) -> Option<String> {
    labels.get(key).cloned().or_else(|| topology_part(locality, key))
}

/// An endpoint's label, its locality standing in for the topology labels and its network for
/// the network label.
fn endpoint_label(endpoint: &Endpoint, key: &str) -> Option<String> {
    if let Some(value) = endpoint.labels.get(key) {
        return Some(value.clone());
    }
    if key == "topology.istio.io/network" && !endpoint.network.is_empty() {
        return Some(endpoint.network.to_string());
    }
    topology_part(&parse(&endpoint.locality), key)
}

fn topology_part(locality: &Locality, key: &str) -> Option<String> {
    let value = match TOPOLOGY.iter().position(|t| *t == key)? {
        0 => &locality.region,
        1 => &locality.zone,
        _ => &locality.sub_zone,
    };
    (!value.is_empty()).then(|| value.clone())
}

/// `region/zone/subzone` as Envoy's locality (missing parts empty).
pub(super) fn parse(locality: &str) -> Locality {
    let mut parts = locality.splitn(3, '/').map(str::to_string);
    Locality {
        region: parts.next().unwrap_or_default(),
        zone: parts.next().unwrap_or_default(),
        sub_zone: parts.next().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::endpoint::v3::LbEndpoint;

    use super::*;

    fn group<'a>(locality: &str, endpoints: &[&'a Endpoint]) -> Group<'a> {
        let one = LbEndpoint { load_balancing_weight: Some(u32_value(1)), ..Default::default() };
        let lb = endpoints.iter().map(|_| one.clone()).collect();
        let weight = u32::try_from(endpoints.len()).unwrap_or(1);
        let g = LocalityLbEndpoints {
            locality: Some(parse(locality)),
            lb_endpoints: lb,
            load_balancing_weight: Some(u32_value(weight)),
            ..Default::default()
        };
        (g, endpoints.to_vec())
    }

    fn endpoint(address: &str, labels: &[(&str, &str)]) -> Endpoint {
        let mut e = Endpoint::at(address.into());
        e.labels = std::sync::Arc::new(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        e
    }

    fn priorities(out: &[LocalityLbEndpoints]) -> Vec<(String, u32)> {
        out.iter()
            .map(|g| {
                let l = g.locality.clone().unwrap_or_default();
                (format!("{}/{}/{}", l.region, l.zone, l.sub_zone), g.priority)
            })
            .collect()
    }

    fn setting(yaml: &str) -> LocalityLbSetting {
        serde_saphyr::from_str(yaml).expect("a setting")
    }

    #[test]
    fn failover_orders_localities_by_distance_only_with_outlier_detection() {
        let e = endpoint("10.0.0.1", &[]);
        let groups = || {
            vec![
                group("us/a/1", &[&e]),
                group("us/a/2", &[&e]),
                group("us/b/1", &[&e]),
                group("eu/a/1", &[&e]),
                group("ap/a/1", &[&e]),
            ]
        };
        let labels = Labels::new();
        let client = Client { locality: "us/a/1", labels: &labels };
        let on = LocalityLbSetting::default();
        let out = apply(groups(), Some(&on), true, client);
        let got: Vec<u32> = priorities(&out).into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, [0, 1, 2, 3, 3]);
        // Without outlier detection Envoy could never leave priority 0: nothing is set.
        let out = apply(groups(), Some(&on), false, client);
        assert!(out.iter().all(|g| g.priority == 0));
        // failover names the region after us: the other regions come last.
        let rule = setting("{failover: [{from: us, to: ap}]}");
        let out = apply(groups(), Some(&rule), true, client);
        let got: Vec<u32> = priorities(&out).into_iter().map(|(_, p)| p).collect();
        assert_eq!(got, [0, 1, 2, 4, 3], "ap before eu, numbered without gaps");
    }

    #[test]
    fn distribute_weighs_the_named_localities_and_empties_the_rest() {
        let e = endpoint("10.0.0.1", &[]);
        let groups = vec![group("us/a", &[&e, &e]), group("us/b", &[&e]), group("eu/a", &[&e])];
        let labels = Labels::new();
        let rule = setting("{distribute: [{from: 'us/*', to: {'us/a': 80, 'us/b': 20}}]}");
        let out = apply(groups, Some(&rule), false, Client { locality: "us/a", labels: &labels });
        let weights: Vec<u32> = out.iter().map(|g| g.load_balancing_weight.map_or(0, |w| w.value)).collect();
        assert_eq!(weights, [80, 20, 1], "eu/a keeps its weight but no endpoints");
        assert_eq!(out.iter().map(|g| g.lb_endpoints.len()).collect::<Vec<_>>(), [2, 1, 0]);
    }

    #[test]
    fn failover_priority_splits_localities_by_shared_labels() {
        let same = endpoint("10.0.0.1", &[("version", "v1"), ("tier", "a")]);
        let half = endpoint("10.0.0.2", &[("version", "v1"), ("tier", "b")]);
        let none = endpoint("10.0.0.3", &[("version", "v2")]);
        let groups = vec![group("us/a", &[&same, &half, &none])];
        let labels: Labels =
            [("version", "v1"), ("tier", "a")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let rule = setting("{failoverPriority: [version, tier]}");
        let out = apply(groups, Some(&rule), true, Client { locality: "us/a", labels: &labels });
        let split: Vec<(u32, usize)> = out.iter().map(|g| (g.priority, g.lb_endpoints.len())).collect();
        assert_eq!(split, [(0, 1), (1, 1), (2, 1)]);
        // A fixed value overrides the client's, and the zone comes from the locality.
        let located = |e: &Endpoint, locality: &str| Endpoint { locality: locality.into(), ..e.clone() };
        let (same, none, half) = (located(&same, "us/a"), located(&none, "us/a"), located(&half, "us/b"));
        let groups = vec![group("us/a", &[&same, &none]), group("us/b", &[&half])];
        let rule = setting("{failoverPriority: ['version=v2', topology.kubernetes.io/zone]}");
        let out = apply(groups, Some(&rule), true, Client { locality: "us/a", labels: &labels });
        let split: Vec<(u32, usize)> = out.iter().map(|g| (g.priority, g.lb_endpoints.len())).collect();
        assert_eq!(split, [(0, 1), (1, 1), (1, 1)], "v2 in the client's zone first, then the v1s");
    }

    #[test]
    fn the_rule_overrides_the_mesh_and_enabled_false_switches_it_off() {
        let mesh = MeshConfig::default();
        assert!(effective(None, &mesh).is_some(), "Istio's mesh default is on");
        let off = setting("{enabled: false}");
        assert!(effective(Some(&off), &mesh).is_none());
        let mesh_off = MeshConfig { locality_lb_setting: Some(off.clone()), ..MeshConfig::default() };
        assert!(effective(None, &mesh_off).is_none());
        assert!(weighs_localities(Some(&setting("{failover: [{from: a, to: b}]}")), true));
        assert!(!weighs_localities(Some(&setting("{failover: [{from: a, to: b}]}")), false));
        assert!(!weighs_localities(effective(None, &mesh), true), "the bare default weighs nothing");
    }
}
