//! Delegate VirtualServices merged into their roots, as istiod merges them before translating: a
//! root's HTTP rule that names a delegate is replaced by the delegate's rules, each narrowed to
//! the root rule's matches and filling what it leaves unset from the root rule. A delegate has no
//! hosts and is never served on its own; a delegate that is missing, has hosts, or is not exported
//! to the root's namespace drops the root rule (istiod's behaviour).

use std::collections::BTreeMap;

use crate::config::api::virtual_service::{Destination, HttpMatchRequest, HttpRoute};
use crate::config::api::{StringMatch, VirtualService};
use crate::config::{ConfigKey, ConfigObjects, Kind, Spec};
use crate::mesh::MeshConfig;
use crate::registry::{Hostname, Visibility};

/// A root VirtualService with its delegates' rules merged in.
#[derive(Debug)]
pub(super) struct MergedRoot {
    /// The root's spec with every delegating rule replaced.
    pub(super) spec: VirtualService,
    /// Every delegate the root names, found or not: a change to any of them merges the root again.
    pub(super) delegates: Vec<ConfigKey>,
}

/// `root` (the VirtualService `key`) with its delegates from `configs` merged in; `None` when no
/// HTTP rule of it delegates.
pub(super) fn merge_root(
    key: &ConfigKey,
    root: &VirtualService,
    configs: &ConfigObjects,
    mesh: &MeshConfig,
) -> Option<MergedRoot> {
    if root.http.iter().all(|r| r.delegate.is_none()) {
        return None;
    }
    let mut delegates = Vec::new();
    let mut http = Vec::new();
    for rule in &root.http {
        let Some(delegate) = &rule.delegate else {
            http.push(rule.clone());
            continue;
        };
        let namespace = if delegate.namespace.is_empty() { &key.namespace } else { &delegate.namespace };
        let delegate_key =
            ConfigKey { kind: Kind::VirtualService, namespace: namespace.clone(), name: delegate.name.clone() };
        if let Some(rules) = delegate_rules(&delegate_key, &key.namespace, configs, mesh) {
            http.extend(rules.iter().filter_map(|sub| merge_rule(rule, sub)));
        }
        delegates.push(delegate_key);
    }
    delegates.sort();
    delegates.dedup();
    Some(MergedRoot { spec: VirtualService { http, ..root.clone() }, delegates })
}

/// The HTTP rules of the delegate `key` as a root in `root_namespace` may use them (their short
/// destination hosts qualified in the delegate's namespace), if it exists, is a delegate and is
/// exported there.
fn delegate_rules(
    key: &ConfigKey,
    root_namespace: &str,
    configs: &ConfigObjects,
    mesh: &MeshConfig,
) -> Option<Vec<HttpRoute>> {
    let Spec::VirtualService(delegate) = &configs.get(key)?.spec else { return None };
    if !delegate.hosts.is_empty() {
        return None;
    }
    let visibility =
        Visibility::from_export_to(&delegate.export_to, &key.namespace, &mesh.default_virtual_service_export_to);
    if !visibility.visible_to(root_namespace) {
        return None;
    }
    let qualify =
        |d: &mut Destination| d.host = Hostname::qualify(&d.host, &key.namespace, &mesh.domain).as_str().into();
    let mut rules = delegate.http.clone();
    for rule in &mut rules {
        rule.route.iter_mut().filter_map(|r| r.destination.as_mut()).for_each(qualify);
        rule.mirror.iter_mut().for_each(qualify);
        rule.mirrors.iter_mut().filter_map(|m| m.destination.as_mut()).for_each(qualify);
    }
    Some(rules)
}

/// The delegate rule `sub` under the root rule `root`: its matches narrowed to the root's, its
/// name prefixed with the root's, and every action field it leaves unset taken from the root.
/// `None` when one of its matches fits none of the root's (the rule is dropped).
fn merge_rule(root: &HttpRoute, sub: &HttpRoute) -> Option<HttpRoute> {
    let mut out = sub.clone();
    out.matches = merge_matches(&root.matches, &sub.matches)?;
    out.name = joined(&root.name, &sub.name);
    out.delegate = None;
    fill(&mut out.rewrite, &root.rewrite);
    fill(&mut out.direct_response, &root.direct_response);
    fill(&mut out.timeout, &root.timeout);
    fill(&mut out.retries, &root.retries);
    fill(&mut out.fault, &root.fault);
    fill(&mut out.mirror, &root.mirror);
    fill(&mut out.mirror_percent, &root.mirror_percent);
    fill(&mut out.mirror_percentage, &root.mirror_percentage);
    fill(&mut out.cors_policy, &root.cors_policy);
    fill(&mut out.headers, &root.headers);
    if out.mirrors.is_empty() {
        out.mirrors = root.mirrors.clone();
    }
    Some(out)
}

/// Every delegate match combined with each root match it fits; `None` when some delegate match
/// fits none (or nothing results).
fn merge_matches(root: &[HttpMatchRequest], sub: &[HttpMatchRequest]) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(sub.to_vec());
    }
    if sub.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for leaf in sub {
        let fitting: Vec<_> = root.iter().filter(|r| !conflicts(r, leaf)).map(|r| merge_match(r, leaf)).collect();
        if fitting.is_empty() {
            return None;
        }
        out.extend(fitting);
    }
    Some(out)
}

/// The delegate match `leaf` with what it leaves unset taken from the root match; maps are
/// joined, the delegate's entry winning.
fn merge_match(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> HttpMatchRequest {
    let mut out = leaf.clone();
    out.name = joined(&root.name, &leaf.name);
    fill(&mut out.uri, &root.uri);
    fill(&mut out.scheme, &root.scheme);
    fill(&mut out.method, &root.method);
    fill(&mut out.authority, &root.authority);
    fill(&mut out.port, &root.port);
    out.headers = joined_map(&root.headers, &leaf.headers);
    out.without_headers = joined_map(&root.without_headers, &leaf.without_headers);
    out.query_params = joined_map(&root.query_params, &leaf.query_params);
    out.source_labels = joined_map(&root.source_labels, &leaf.source_labels);
    if out.source_namespace.is_empty() {
        out.source_namespace = root.source_namespace.clone();
    }
    if out.gateways.is_empty() {
        out.gateways = root.gateways.clone();
    }
    if out.stat_prefix.is_empty() {
        out.stat_prefix = root.stat_prefix.clone();
    }
    out
}

/// Whether the delegate match `leaf` asks for something outside the root match `root`.
fn conflicts(root: &HttpMatchRequest, leaf: &HttpMatchRequest) -> bool {
    let fields = [(&root.uri, &leaf.uri), (&root.scheme, &leaf.scheme), (&root.method, &leaf.method)];
    let strings = fields.into_iter().chain([(&root.authority, &leaf.authority)]);
    let maps = [
        (&root.headers, &leaf.headers),
        (&root.without_headers, &leaf.without_headers),
        (&root.query_params, &leaf.query_params),
    ];
    strings.into_iter().any(|(r, l)| string_conflict(r.as_ref(), l.as_ref()))
        || maps.iter().any(|(r, l)| l.iter().any(|(k, v)| string_conflict(r.get(k), Some(v))))
        || root.ignore_uri_case != leaf.ignore_uri_case
        || matches!((root.port, leaf.port), (Some(r), Some(l)) if r > 0 && l > 0 && r != l)
        || (!root.source_namespace.is_empty() && leaf.source_namespace != root.source_namespace)
        || leaf.source_labels.iter().any(|(k, v)| root.source_labels.get(k).is_some_and(|r| r != v))
        || (!root.gateways.is_empty()
            && !leaf.gateways.is_empty()
            && !leaf.gateways.iter().all(|g| root.gateways.contains(g)))
}

/// Whether a delegate's string match asks for values the root's does not admit (no conflict when
/// either is unset; a regex on either side conflicts with any other match).
fn string_conflict(root: Option<&StringMatch>, leaf: Option<&StringMatch>) -> bool {
    let (Some(root), Some(leaf)) = (root, leaf) else { return false };
    match (root, leaf) {
        (StringMatch::Regex(_), _) | (_, StringMatch::Regex(_)) => true,
        (StringMatch::Exact(r), StringMatch::Exact(l)) => r != l,
        (StringMatch::Exact(_), StringMatch::Prefix(_)) => true,
        (StringMatch::Prefix(r), StringMatch::Prefix(l) | StringMatch::Exact(l)) => !l.starts_with(r.as_str()),
    }
}

/// `root-leaf`, or whichever of the two is set.
fn joined(root: &str, leaf: &str) -> String {
    match (root.is_empty(), leaf.is_empty()) {
        (_, true) => root.to_string(),
        (true, false) => leaf.to_string(),
        (false, false) => format!("{root}-{leaf}"),
    }
}

/// `root`'s entries with `leaf`'s over them.
fn joined_map<V: Clone>(root: &BTreeMap<String, V>, leaf: &BTreeMap<String, V>) -> BTreeMap<String, V> {
    let mut out = root.clone();
    out.extend(leaf.iter().map(|(k, v)| (k.clone(), v.clone())));
    out
}

/// Sets `field` to `root`'s value when it is unset.
fn fill<T: Clone>(field: &mut Option<T>, root: &Option<T>) {
    if field.is_none() {
        field.clone_from(root);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::parse::{parse_file, Document};

    fn vs(ns: &str, name: &str, spec: &str) -> String {
        format!("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n---\n")
    }

    /// The root `shop/root` of `yaml` merged.
    fn merged(yaml: &str) -> Option<MergedRoot> {
        let mut configs = ConfigObjects::new();
        for doc in parse_file("t.yaml", yaml) {
            let Document::Valid(o) = doc else { panic!("{doc:?}") };
            configs.insert(o.key.clone(), Arc::new(o));
        }
        let key = ConfigKey { kind: Kind::VirtualService, namespace: "shop".into(), name: "root".into() };
        let Some(Spec::VirtualService(root)) = configs.get(&key).map(|c| c.spec.clone()) else { panic!("no root") };
        merge_root(&key, &root, &configs, &MeshConfig::default())
    }

    const ROOT: &str = "{hosts: [shop.example.com], gateways: [gw], http: [
        {name: api, match: [{uri: {prefix: /api}, headers: {x-team: {exact: a}}}], timeout: 3s, delegate: {name: api, namespace: team}},
        {route: [{destination: {host: web}}]}]}";

    #[test]
    fn delegate_rules_narrow_to_the_root_match_and_inherit_what_they_leave_unset() {
        let delegate = "{http: [
            {name: v2, match: [{uri: {prefix: /api/v2}, headers: {x-v: {exact: '2'}}}], route: [{destination: {host: api-v2}}]},
            {route: [{destination: {host: api}}], timeout: 1s}]}";
        let m = merged(&[vs("shop", "root", ROOT), vs("team", "api", delegate)].concat()).expect("a root");
        assert_eq!(m.delegates.iter().map(ToString::to_string).collect::<Vec<_>>(), ["VirtualService team/api"]);
        let http = &m.spec.http;
        assert_eq!(http.len(), 3, "two delegate rules then the root's own");
        assert_eq!(http[0].name, "api-v2");
        assert_eq!(http[0].matches[0].uri, Some(StringMatch::Prefix("/api/v2".into())));
        assert_eq!(http[0].matches[0].headers.keys().collect::<Vec<_>>(), ["x-team", "x-v"]);
        assert_eq!(http[0].timeout, crate::config::api::Duration::parse("3s").ok());
        // A rule without match takes the root's; short hosts are the delegate's namespace's.
        assert_eq!(http[1].matches[0].uri, Some(StringMatch::Prefix("/api".into())));
        assert_eq!(http[1].route[0].destination.as_ref().map(|d| d.host.as_str()), Some("api.team.svc.cluster.local"));
        assert!(http[1].timeout != http[0].timeout, "its own timeout stays");
        assert!(http.iter().all(|r| r.delegate.is_none()));
        assert_eq!(http[2].route[0].destination.as_ref().map(|d| d.host.as_str()), Some("web"));
    }

    #[test]
    fn a_delegate_rule_outside_the_root_match_is_dropped() {
        let delegate = "{http: [
            {match: [{uri: {prefix: /other}}], route: [{destination: {host: a}}]},
            {match: [{uri: {regex: /api.*}}], route: [{destination: {host: b}}]},
            {match: [{headers: {x-team: {exact: b}}}], route: [{destination: {host: c}}]},
            {match: [{uri: {exact: /api/ok}}], route: [{destination: {host: d}}]}]}";
        let m = merged(&[vs("shop", "root", ROOT), vs("team", "api", delegate)].concat()).expect("a root");
        let hosts: Vec<_> =
            m.spec.http.iter().filter_map(|r| r.route[0].destination.as_ref()).map(|d| &d.host).collect();
        assert_eq!(hosts, ["d.team.svc.cluster.local", "web"]);
    }

    #[test]
    fn a_missing_hidden_or_hosted_delegate_drops_the_root_rule_but_is_remembered() {
        let route = "http: [{route: [{destination: {host: a}}]}]";
        for delegate in [
            String::new(),
            vs("team", "api", &format!("{{exportTo: [team], {route}}}")),
            vs("team", "api", &format!("{{hosts: [api], {route}}}")),
        ] {
            let m = merged(&[vs("shop", "root", ROOT), delegate.clone()].concat()).expect("a root");
            assert_eq!(m.spec.http.len(), 1, "{delegate}");
            assert_eq!(m.delegates.len(), 1);
        }
        let exported = vs("team", "api", &format!("{{exportTo: [shop], {route}}}"));
        assert_eq!(merged(&[vs("shop", "root", ROOT), exported].concat()).expect("a root").spec.http.len(), 2);
        assert!(merged(&vs("shop", "root", "{hosts: [a], http: [{route: [{destination: {host: a}}]}]}")).is_none());
    }
}
