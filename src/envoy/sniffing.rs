//! Protocol sniffing, as Istio does it for ports of unknown protocol: the HTTP inspector sets an
//! HTTP ALPN value on plaintext HTTP connections, an HTTP filter chain matches those values and
//! a TCP chain takes the rest. Listener filters run only on ports whose chains need them.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::listener::v3::{
    listener_filter,
    listener_filter_chain_match_predicate::{MatchSet, Rule},
    FilterChain, FilterChainMatch, ListenerFilter, ListenerFilterChainMatchPredicate,
};
use envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::listener::original_src::v3::OriginalSrc;
use envoy_types::pb::envoy::r#type::v3::Int32Range;
use prost::{Message, Name};

use super::names::{ext, PLAINTEXT_HTTP_ALPNS, RAW_BUFFER};
use super::network_filter::tls_inspector;
use super::proto::any;
use crate::config::api::Protocol;

/// Istio's TLS transport protocol value.
const TLS: &str = "tls";

/// The mark Istio's TPROXY rules route back to the proxy.
const TPROXY_MARK: u32 = 1337;

/// How a listener treats a port's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Sniffed {
    /// Declared HTTP: the HTTP connection manager.
    Http,
    /// Declared TCP-like: a TCP proxy.
    Tcp,
    /// Unknown: HTTP if the inspector recognises HTTP, else TCP.
    Auto,
}

impl Sniffed {
    /// Istio's listener protocol of a port protocol.
    pub(super) fn of(protocol: Protocol) -> Sniffed {
        match protocol {
            p if p.is_http() => Sniffed::Http,
            Protocol::Unsupported => Sniffed::Auto,
            _ => Sniffed::Tcp,
        }
    }
}

/// Adds the HTTP ALPN match a sniffed port's HTTP chain needs to `m`.
pub(super) fn require_http(m: Option<FilterChainMatch>) -> FilterChainMatch {
    let mut m = m.unwrap_or_default();
    m.application_protocols = PLAINTEXT_HTTP_ALPNS.iter().map(|a| a.to_string()).collect();
    m.transport_protocol = RAW_BUFFER.to_string();
    m
}

/// The original destination listener filter: connections iptables redirected get their original
/// destination back, which filter chains then match on.
pub(super) fn original_dst() -> ListenerFilter {
    listener_filter(ext::ORIGINAL_DST, OriginalDst::default())
}

/// The original source listener filter (TPROXY interception).
pub(super) fn original_src() -> ListenerFilter {
    listener_filter(ext::ORIGINAL_SRC, OriginalSrc { mark: TPROXY_MARK, ..Default::default() })
}

/// The HTTP inspector.
pub(super) fn http_inspector() -> ListenerFilter {
    listener_filter(ext::HTTP_INSPECTOR, HttpInspector::default())
}

/// The inspectors the chains of a listener need: the TLS inspector where a chain matches the TLS
/// transport, then the HTTP inspector where a chain matches HTTP ALPN values, each disabled on
/// the destination ports whose chains do not need it.
pub(super) fn inspectors(chains: &[FilterChain]) -> Vec<ListenerFilter> {
    // Per destination port (0: chains for any port): whether TLS and HTTP inspection is needed.
    let mut needs: BTreeMap<i32, (bool, bool)> = BTreeMap::new();
    for m in chains.iter().map(|c| c.filter_chain_match.clone().unwrap_or_default()) {
        let port = m.destination_port.map(|p| i32::try_from(p.value).unwrap_or(0)).unwrap_or(0);
        let entry = needs.entry(port).or_default();
        entry.0 |= m.transport_protocol == TLS;
        entry.1 |= m.application_protocols.iter().any(|a| PLAINTEXT_HTTP_ALPNS.contains(&a.as_str()));
    }
    let mut out = Vec::new();
    out.extend(enabled_where(&needs, |n| n.0, tls_inspector));
    // After the TLS inspector: a connection it found to be TLS is not inspected for HTTP.
    out.extend(enabled_where(&needs, |n| n.1, http_inspector));
    out
}

/// `make()`, disabled on the ports where `needed` is false; `None` if no port needs it.
fn enabled_where(
    needs: &BTreeMap<i32, (bool, bool)>,
    needed: impl Fn(&(bool, bool)) -> bool,
    make: impl Fn() -> ListenerFilter,
) -> Option<ListenerFilter> {
    if !needs.values().any(&needed) {
        return None;
    }
    let mut filter = make();
    let default_on = needs.get(&0).is_some_and(&needed);
    let listed = |on: bool| needs.iter().filter(|(p, n)| **p != 0 && needed(n) == on).map(|(p, _)| *p).collect();
    filter.filter_disabled = if default_on {
        ports_predicate(listed(false))
    } else {
        // Off except on the ports that need it.
        ports_predicate(listed(true))
            .map(|on| ListenerFilterChainMatchPredicate { rule: Some(Rule::NotMatch(Box::new(on))) })
    };
    Some(filter)
}

/// Matches connections to any of `ports`; `None` for no ports.
fn ports_predicate(ports: Vec<i32>) -> Option<ListenerFilterChainMatchPredicate> {
    let mut rules: Vec<ListenerFilterChainMatchPredicate> = ports
        .into_iter()
        .map(|p| ListenerFilterChainMatchPredicate {
            rule: Some(Rule::DestinationPortRange(Int32Range { start: p, end: p.saturating_add(1) })),
        })
        .collect();
    match rules.len() {
        0 => None,
        1 => rules.pop(),
        _ => Some(ListenerFilterChainMatchPredicate { rule: Some(Rule::OrMatch(MatchSet { rules })) }),
    }
}

fn listener_filter<T: Name + Message>(name: &str, config: T) -> ListenerFilter {
    ListenerFilter {
        name: name.to_string(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(config))),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envoy::network_filter::chain;
    use crate::envoy::proto::u32_value;

    /// A filter chain match for plaintext HTTP on `port` (any port when `None`).
    fn http_match(port: Option<u16>) -> FilterChainMatch {
        FilterChainMatch {
            destination_port: port.map(|p| u32_value(u32::from(p))),
            application_protocols: PLAINTEXT_HTTP_ALPNS.iter().map(|a| a.to_string()).collect(),
            transport_protocol: RAW_BUFFER.to_string(),
            ..Default::default()
        }
    }

    /// A filter chain match for any plaintext connection on `port` (any port when `None`).
    fn raw_match(port: Option<u16>) -> FilterChainMatch {
        FilterChainMatch {
            destination_port: port.map(|p| u32_value(u32::from(p))),
            transport_protocol: RAW_BUFFER.to_string(),
            ..Default::default()
        }
    }

    fn with(m: FilterChainMatch) -> FilterChain {
        chain(String::new(), Some(m), Vec::new(), None)
    }

    #[test]
    fn http_inspector_runs_only_where_a_chain_matches_http() {
        assert!(inspectors(&[with(raw_match(Some(80)))]).is_empty(), "TCP only: no inspection");
        // Passthrough chains sniff every port; declared ports opt out.
        let got = inspectors(&[
            with(http_match(None)),
            with(raw_match(None)),
            with(raw_match(Some(5432))),
            with(raw_match(Some(15006))),
        ]);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].name, ext::HTTP_INSPECTOR);
        let Some(Rule::OrMatch(set)) = got[0].filter_disabled.as_ref().and_then(|p| p.rule.clone()) else {
            panic!("disabled on the TCP ports: {:?}", got[0].filter_disabled)
        };
        assert_eq!(set.rules.len(), 2);
        // Without passthrough chains, only the sniffed port is inspected.
        let got = inspectors(&[with(http_match(Some(9000))), with(raw_match(Some(9000))), with(raw_match(Some(5432)))]);
        let Some(Rule::NotMatch(on)) = got[0].filter_disabled.as_ref().and_then(|p| p.rule.clone()) else {
            panic!("enabled on 9000 only: {:?}", got[0].filter_disabled)
        };
        assert_eq!(on.rule, Some(Rule::DestinationPortRange(Int32Range { start: 9000, end: 9001 })));
    }
}
