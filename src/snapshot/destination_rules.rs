//! Which DestinationRule a proxy applies to a service, as istiod decides it: rules for one host
//! in one namespace are merged (subsets added by name, the first traffic policy kept), indexed
//! per namespace as seen from inside it, as exported to others, and (private ones) for the root
//! namespace; a lookup tries the proxy's namespace (the root namespace's private rules for a
//! proxy there), then the service's namespace, then the root namespace, and within a namespace
//! the most specific host. A rule with a workload selector is private to its namespace and, for
//! outbound traffic, applies only to the workloads it selects.
//!
//! Built once per snapshot that changes a DestinationRule, from the indexed rules; lookups are
//! then map reads.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::config::api::{DestinationRule, Labels};
use crate::config::ConfigKey;
use crate::registry::{Hostname, Service};

/// One host's rule after merging the rules of one namespace that name it.
#[derive(Debug)]
pub struct MergedRule {
    /// The merged rule: the first rule's fields, with the others' new subsets and, when it had
    /// none, the first traffic policy among them.
    pub rule: DestinationRule,
    /// The namespace of the rules.
    namespace: String,
    /// The rules merged, in merge order.
    pub from: Vec<ConfigKey>,
    /// `exportTo` as written (a rule with a workload selector: `.`).
    export_to: BTreeSet<String>,
}

impl MergedRule {
    /// Whether a proxy in `namespace` sees this rule when it is exported from its own.
    fn exported_to(&self, namespace: &str) -> bool {
        self.export_to.is_empty() || self.export_to.contains("*") || self.export_to.contains(namespace)
    }
}

/// Merged rules by host: exact hosts, and wildcard hosts.
#[derive(Debug, Default)]
struct ByHost {
    specific: HashMap<Hostname, Vec<Arc<MergedRule>>>,
    wildcard: HashMap<Hostname, Vec<Arc<MergedRule>>>,
}

impl ByHost {
    /// The rules of the most specific host matching `host`: the exact host, else the longest
    /// wildcard covering it (istiod's `MostSpecificHostMatch`).
    fn most_specific(&self, host: &Hostname) -> Option<&[Arc<MergedRule>]> {
        let name = host.as_str();
        let exact = if host.is_wildcard() { self.wildcard.get(host) } else { self.specific.get(host) };
        if let Some(rules) = exact {
            return Some(rules);
        }
        // A wildcard needle matches by its suffix after the `*`.
        let needle = name.strip_prefix('*').unwrap_or(name);
        let covering = self.wildcard.iter().filter(|(h, _)| needle.ends_with(&h.as_str()[1..]));
        covering.max_by(|(a, _), (b, _)| a.as_str().len().cmp(&b.as_str().len()).then(b.cmp(a))).map(|(_, r)| &r[..])
    }
}

/// Rules while they are merged.
#[derive(Default)]
struct Merging {
    specific: HashMap<Hostname, Vec<MergedRule>>,
    wildcard: HashMap<Hostname, Vec<MergedRule>>,
}

impl Merging {
    /// Merges `rule` (of `key`, for `host`) into what is there, as istiod's `mergeDestinationRule`
    /// does with exportTo-aware merging on (its default).
    fn merge(&mut self, key: &ConfigKey, host: &Hostname, rule: &DestinationRule, export_to: &BTreeSet<String>) {
        let map = if host.is_wildcard() { &mut self.wildcard } else { &mut self.specific };
        let list = map.entry(host.clone()).or_default();
        let mut separately = true;
        for merged in list.iter_mut() {
            if *export_to == merged.export_to {
                separately = false;
            } else if merged.export_to.is_empty() || !export_to.is_superset(&merged.export_to) {
                // Exported elsewhere: kept apart.
                separately = true;
                continue;
            } else {
                separately = true;
            }
            let (existing, incoming) = (merged.rule.workload_selector.as_ref(), rule.workload_selector.as_ref());
            match (existing, incoming) {
                (Some(a), Some(b)) if a.match_labels != b.match_labels => {
                    separately = true;
                    continue;
                }
                (None, None) | (Some(_), Some(_)) => separately = false,
                _ => {}
            }
            merged.from.push(key.clone());
            for subset in &rule.subsets {
                if !merged.rule.subsets.iter().any(|s| s.name == subset.name) {
                    merged.rule.subsets.push(subset.clone());
                }
            }
            if merged.rule.traffic_policy.is_none() {
                merged.rule.traffic_policy = rule.traffic_policy.clone();
            }
        }
        if separately {
            list.push(MergedRule {
                rule: rule.clone(),
                namespace: key.namespace.clone(),
                from: vec![key.clone()],
                export_to: export_to.clone(),
            });
        }
    }

    fn done(self) -> ByHost {
        let share = |map: HashMap<Hostname, Vec<MergedRule>>| {
            map.into_iter().map(|(h, rules)| (h, rules.into_iter().map(Arc::new).collect())).collect()
        };
        ByHost { specific: share(self.specific), wildcard: share(self.wildcard) }
    }
}

/// One rule to index: its key, its host qualified with its namespace, and the rule.
pub(super) struct RuleInput<'a> {
    /// The rule's key.
    pub key: &'a ConfigKey,
    /// Its host, qualified.
    pub host: &'a Hostname,
    /// The rule.
    pub rule: &'a DestinationRule,
}

/// Every DestinationRule of a snapshot, merged and indexed for lookups.
#[derive(Debug, Default)]
pub struct DestinationRuleIndex {
    namespace_local: HashMap<String, ByHost>,
    exported: HashMap<String, ByHost>,
    root_local: ByHost,
    root_namespace: String,
}

/// Which traffic a rule is looked up for: workload selectors apply to outbound traffic only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Traffic the proxy sends.
    Outbound,
    /// Traffic the proxy receives.
    Inbound,
}

impl DestinationRuleIndex {
    /// Indexes `rules` as istiod does; `default_export_to` is the mesh config's
    /// `defaultDestinationRuleExportTo`.
    pub(super) fn new<'a>(
        rules: impl Iterator<Item = RuleInput<'a>>,
        root_namespace: &str,
        default_export_to: &[String],
    ) -> DestinationRuleIndex {
        let mut rules: Vec<RuleInput<'a>> = rules.collect();
        // Rules with a selector first, then by name and namespace (istiod orders by creation time
        // before the name; objects from files have none).
        rules.sort_by(|a, b| {
            let selectorless = |r: &RuleInput<'_>| r.rule.workload_selector.is_none();
            (selectorless(a), &a.key.name, &a.key.namespace).cmp(&(selectorless(b), &b.key.name, &b.key.namespace))
        });
        let default_private = default_export_to.iter().any(|e| e == ".");
        let mut local: HashMap<String, Merging> = HashMap::new();
        let mut exported: HashMap<String, Merging> = HashMap::new();
        let mut root_local = Merging::default();
        for RuleInput { key, host, rule } in rules {
            let ns = key.namespace.as_str();
            let export_to: BTreeSet<String> = match rule.workload_selector {
                None => rule.export_to.iter().cloned().collect(),
                Some(_) => BTreeSet::from([".".to_string()]),
            };
            let seen_inside = export_to.is_empty() || ["*", ".", ns].iter().any(|e| export_to.contains(*e));
            if seen_inside {
                local.entry(ns.to_string()).or_default().merge(key, host, rule, &export_to);
            }
            let private = match export_to.len() {
                0 => default_private,
                1 => export_to.contains(".") || export_to.contains(ns),
                _ => false,
            };
            if !private {
                exported.entry(ns.to_string()).or_default().merge(key, host, rule, &export_to);
            } else if ns == root_namespace {
                root_local.merge(key, host, rule, &export_to);
            }
        }
        let done = |m: HashMap<String, Merging>| m.into_iter().map(|(ns, m)| (ns, m.done())).collect();
        DestinationRuleIndex {
            namespace_local: done(local),
            exported: done(exported),
            root_local: root_local.done(),
            root_namespace: root_namespace.to_string(),
        }
    }

    /// The rule a proxy in `namespace` with `labels` applies to `service`'s traffic in `direction`.
    pub fn rule_for(
        &self,
        namespace: &str,
        labels: &Labels,
        service: &Service,
        direction: Direction,
    ) -> Option<&MergedRule> {
        let rules = self.candidates(namespace, service)?;
        let mut catch_all = None;
        for merged in rules {
            match &merged.rule.workload_selector {
                None => catch_all = Some(&**merged),
                Some(selector) => {
                    let selects = selector.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v));
                    if direction == Direction::Outbound && merged.namespace == namespace && selects {
                        return Some(merged);
                    }
                }
            }
        }
        catch_all
    }

    /// The merged rules of the first place that has some for the service's host.
    fn candidates(&self, namespace: &str, service: &Service) -> Option<Vec<&Arc<MergedRule>>> {
        let host = &service.hostname;
        let own = match namespace == self.root_namespace {
            false => self.namespace_local.get(namespace).and_then(|r| r.most_specific(host)),
            true => self.root_local.most_specific(host),
        };
        if let Some(rules) = own {
            return Some(rules.iter().collect());
        }
        let exported = |owner: &str| -> Option<Vec<&Arc<MergedRule>>> {
            let rules = self.exported.get(owner)?.most_specific(host)?;
            let visible: Vec<_> = rules.iter().filter(|r| r.exported_to(namespace)).collect();
            (!visible.is_empty()).then_some(visible)
        };
        if !service.namespace.is_empty() {
            if let Some(rules) = exported(&service.namespace) {
                return Some(rules);
            }
        }
        exported(&self.root_namespace)
    }
}
