//! Inbound filter chains by peer authentication mode, as Istio's filter chain match options: a
//! chain per (transport protocol, ALPN) a client may arrive with, the TLS ones terminating mesh
//! mutual TLS. STRICT keeps only TLS chains, DISABLE only plaintext ones, PERMISSIVE both.

use envoy_types::pb::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch};

use super::mtls::{inbound_transport_socket, InboundTls, ALL_ISTIO_MTLS_ALPNS, MTLS_HTTP_ALPNS, MTLS_TCP_ALPNS};
use super::names::{PLAINTEXT_HTTP_ALPNS, RAW_BUFFER};
use super::network_filter::chain;
use super::proto::u32_value;
use super::sniffing::Sniffed;
use crate::config::api::peer_authentication::MtlsMode;

/// Istio's TLS transport protocol value.
const TLS: &str = "tls";

/// Which filters a chain runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ChainProtocol {
    /// The HTTP connection manager.
    Http,
    /// The TCP proxy.
    Tcp,
}

/// One chain to build: its match and whether it terminates mutual TLS.
struct MatchOption {
    alpns: &'static [&'static str],
    transport: &'static str,
    protocol: ChainProtocol,
    mtls: bool,
}

const fn opt(
    alpns: &'static [&'static str],
    transport: &'static str,
    protocol: ChainProtocol,
    mtls: bool,
) -> MatchOption {
    MatchOption { alpns, transport, protocol, mtls }
}

use ChainProtocol::{Http, Tcp};

/// Istio's `getFilterChainMatchOptions`.
fn options(sniffed: Sniffed, mode: MtlsMode) -> Vec<MatchOption> {
    match (sniffed, mode) {
        (Sniffed::Http, MtlsMode::Strict) => vec![opt(&[], TLS, Http, true)],
        (Sniffed::Http, MtlsMode::Permissive) => {
            vec![opt(&ALL_ISTIO_MTLS_ALPNS, TLS, Http, true), opt(&[], RAW_BUFFER, Http, false)]
        }
        (Sniffed::Http, _) => vec![opt(&[], RAW_BUFFER, Http, false)],
        (Sniffed::Tcp, MtlsMode::Strict) => vec![opt(&[], TLS, Tcp, true)],
        (Sniffed::Tcp, MtlsMode::Permissive) => vec![
            opt(&ALL_ISTIO_MTLS_ALPNS, TLS, Tcp, true),
            // TLS a client without sidecar started itself: passed through to the workload.
            opt(&[], TLS, Tcp, false),
            opt(&[], RAW_BUFFER, Tcp, false),
        ],
        (Sniffed::Tcp, _) => vec![opt(&[], RAW_BUFFER, Tcp, false)],
        (Sniffed::Auto, MtlsMode::Strict) => vec![opt(&MTLS_HTTP_ALPNS, TLS, Http, true), opt(&[], TLS, Tcp, true)],
        (Sniffed::Auto, MtlsMode::Permissive) => vec![
            opt(&MTLS_HTTP_ALPNS, TLS, Http, true),
            opt(&PLAINTEXT_HTTP_ALPNS, RAW_BUFFER, Http, false),
            opt(&MTLS_TCP_ALPNS, TLS, Tcp, true),
            opt(&[], RAW_BUFFER, Tcp, false),
            opt(&[], TLS, Tcp, false),
        ],
        (Sniffed::Auto, _) => {
            vec![opt(&PLAINTEXT_HTTP_ALPNS, RAW_BUFFER, Http, false), opt(&[], RAW_BUFFER, Tcp, false)]
        }
    }
}

/// The chains of one inbound port (any port when `port` is `None`) under `mode`, mutual TLS
/// admitting peers of `trust_domain` only. `name` names a chain by its protocol; `http` and `tcp`
/// build its filters.
pub(super) fn inbound_chains(
    port: Option<u16>,
    sniffed: Sniffed,
    mode: MtlsMode,
    trust_domain: &str,
    name: impl Fn(ChainProtocol) -> String,
    http: impl Fn() -> Filter,
    tcp: impl Fn() -> Vec<Filter>,
) -> Vec<FilterChain> {
    options(sniffed, mode)
        .into_iter()
        .map(|o| {
            let m = FilterChainMatch {
                destination_port: port.map(|p| u32_value(u32::from(p))),
                application_protocols: o.alpns.iter().map(|a| a.to_string()).collect(),
                transport_protocol: o.transport.to_string(),
                ..Default::default()
            };
            let (filters, tls) = match o.protocol {
                Http => (vec![http()], InboundTls::Http),
                Tcp => (tcp(), InboundTls::Tcp),
            };
            let socket = o.mtls.then(|| inbound_transport_socket(tls, trust_domain));
            chain(name(o.protocol), Some(m), filters, socket)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shapes(sniffed: Sniffed, mode: MtlsMode) -> Vec<(String, usize, bool)> {
        let f = || Filter::default();
        inbound_chains(Some(80), sniffed, mode, "cluster.local", |_| String::new(), f, || vec![f()])
            .iter()
            .map(|c| {
                let m = c.filter_chain_match.clone().unwrap_or_default();
                (m.transport_protocol, m.application_protocols.len(), c.transport_socket.is_some())
            })
            .collect()
    }

    fn t(transport: &str, alpns: usize, tls: bool) -> (String, usize, bool) {
        (transport.to_string(), alpns, tls)
    }

    #[test]
    fn strict_takes_only_mutual_tls_and_disable_only_plaintext() {
        assert_eq!(shapes(Sniffed::Http, MtlsMode::Strict), [t("tls", 0, true)]);
        assert_eq!(shapes(Sniffed::Tcp, MtlsMode::Strict), [t("tls", 0, true)]);
        assert_eq!(shapes(Sniffed::Auto, MtlsMode::Strict), [t("tls", 3, true), t("tls", 0, true)]);
        assert_eq!(shapes(Sniffed::Http, MtlsMode::Disable), [t("raw_buffer", 0, false)]);
        assert_eq!(shapes(Sniffed::Auto, MtlsMode::Disable), [t("raw_buffer", 2, false), t("raw_buffer", 0, false)]);
    }

    #[test]
    fn permissive_takes_both() {
        assert_eq!(shapes(Sniffed::Http, MtlsMode::Permissive), [t("tls", 5, true), t("raw_buffer", 0, false)]);
        assert_eq!(
            shapes(Sniffed::Tcp, MtlsMode::Permissive),
            [t("tls", 5, true), t("tls", 0, false), t("raw_buffer", 0, false)]
        );
        assert_eq!(shapes(Sniffed::Auto, MtlsMode::Permissive).iter().filter(|s| s.2).count(), 2);
    }
}
