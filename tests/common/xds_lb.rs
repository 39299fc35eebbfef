//! The hashing load balancer in front of meshpilot's frontends, as deployed: a real Envoy that
//! spreads xDS streams over the frontends by consistent hashing of the proxy-key header.
//!
//! ```ignore
//! let lb = XdsLoadBalancer::builder().frontend(fe.id(), fe.xds_addr()).start().await;
//! let envoy = Envoy::builder(node_id, lb.addr()).bootstrap_patch(proxy_key_patch("shop/client")).start();
//! ```

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use meshpilot::cluster::ownership::PROXY_KEY_HEADER;
use serde_json::{json, Value};

use super::envoy::{merge_patch, Envoy};
use super::http::{http_client, http_request};
use super::poll::STARTUP_TIMEOUT;
use super::ports::{free_addr, free_port};

/// Bootstrap patch for a proxy Envoy whose ADS goes through the [`XdsLoadBalancer`]: the `xds`
/// gRPC service sends `x-meshpilot-proxy-key: KEY` as initial metadata (the harness's retry
/// back-off kept). Use with [`EnvoyBuilder::bootstrap_patch`](super::envoy::EnvoyBuilder::bootstrap_patch) and the LB's address.
pub fn proxy_key_patch(key: &str) -> Value {
    json!({"dynamic_resources": {"ads_config": {"grpc_services": [{
        "envoy_grpc": {
            "cluster_name": "xds",
            "retry_policy": {"retry_back_off": {"base_interval": "0.1s", "max_interval": "0.5s"}}
        },
        "initial_metadata": [{"key": PROXY_KEY_HEADER, "value": key}]
    }]}}})
}

/// The load balancing policy of the load balancer's `frontends` cluster; the frontends must
/// compute ownership with the same algorithm (`meshpilot::cluster::ownership::ProxyHashing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LbPolicy {
    /// `MAGLEV` with Envoy's default table size (the frontends' default).
    #[default]
    Maglev,
    /// `RING_HASH` with Envoy's default ring sizes.
    RingHash,
}

/// Options for an [`XdsLoadBalancer`]; see [`XdsLoadBalancer::builder`].
pub struct XdsLoadBalancerBuilder {
    frontends: Vec<(String, SocketAddr)>,
    keyed: Vec<String>,
    policy: LbPolicy,
}

impl XdsLoadBalancerBuilder {
    /// A frontend endpoint: its member id (the endpoint's `hash_key`) and xDS address.
    pub fn frontend(mut self, id: &str, xds_addr: SocketAddr) -> Self {
        self.frontends.push((id.to_string(), xds_addr));
        self
    }

    /// An extra listener that sets `x-meshpilot-proxy-key: KEY` on every request before routing,
    /// for ADS clients that cannot send gRPC metadata (the crate's `SimProxy`).
    pub fn keyed_listener(mut self, key: &str) -> Self {
        if !self.keyed.iter().any(|k| k == key) {
            self.keyed.push(key.to_string());
        }
        self
    }

    /// The load balancing policy (default `MAGLEV`).
    pub fn policy(mut self, policy: LbPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Starts the Envoy and waits until it is ready and every frontend is healthy.
    pub async fn start(mut self) -> XdsLoadBalancer {
        // Endpoints in member-id order, as the frontends list them (ring hash depends on it).
        self.frontends.sort();
        let port = free_port();
        let probe_port = free_port();
        let keyed: Vec<(String, u16)> = self.keyed.iter().map(|k| (k.clone(), free_port())).collect();
        let mut builder = Envoy::builder("router~127.0.0.1~xds-lb.meshpilot~meshpilot.svc.cluster.local", free_addr())
            .bootstrap_patch(json!({"dynamic_resources": null}))
            .static_cluster(lb_cluster(&self.frontends, self.policy))
            .static_listener(lb_listener("xds", port, LbListener::Plain))
            .static_listener(lb_listener("probe", probe_port, LbListener::Probe));
        for (i, (key, p)) in keyed.iter().enumerate() {
            builder = builder.static_listener(lb_listener(&format!("xds-keyed-{i}"), *p, LbListener::Keyed(key)));
        }
        let envoy = builder.start();
        envoy.wait_ready(STARTUP_TIMEOUT).await;
        let lb = XdsLoadBalancer { envoy, port, probe_port, keyed, frontends: self.frontends, client: http_client() };
        lb.wait_healthy(lb.frontends.len() as u64, STARTUP_TIMEOUT).await;
        lb
    }
}

/// The cluster `frontends`: MAGLEV (or RING_HASH) over the frontends' xDS addresses (HTTP/2), each
/// endpoint's `hash_key` its member id, TCP health checks every second (one failure marks a
/// frontend down, one success back up), no panic mode (an unhealthy frontend is never picked).
fn lb_cluster(frontends: &[(String, SocketAddr)], policy: LbPolicy) -> Value {
    let endpoints: Vec<Value> = frontends
        .iter()
        .map(|(id, addr)| {
            json!({
                "endpoint": {"address": {"socket_address": {"address": addr.ip().to_string(), "port_value": addr.port()}}},
                "metadata": {"filter_metadata": {"envoy.lb": {"hash_key": id}}}
            })
        })
        .collect();
    let mut cluster = json!({
        "name": "frontends",
        "type": "STATIC",
        "connect_timeout": "1s",
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}
            }
        },
        "health_checks": [{
            "timeout": "1s",
            "interval": "1s",
            "no_traffic_interval": "1s",
            "unhealthy_interval": "1s",
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "tcp_health_check": {}
        }],
        "load_assignment": {"cluster_name": "frontends", "endpoints": [{"lb_endpoints": endpoints}]}
    });
    match policy {
        LbPolicy::RingHash => merge_patch(
            &mut cluster,
            &json!({
                "lb_policy": "RING_HASH",
                "ring_hash_lb_config": {"minimum_ring_size": 1024, "maximum_ring_size": 8388608}
            }),
        ),
        LbPolicy::Maglev => {
            merge_patch(&mut cluster, &json!({"lb_policy": "MAGLEV", "maglev_lb_config": {"table_size": 65537}}))
        }
    }
    cluster
}

/// What a load balancer listener does besides routing by the proxy-key header.
enum LbListener<'a> {
    /// Nothing: xDS clients send the header (HTTP/2 only).
    Plain,
    /// Sets the header to this key first (HTTP/2 only).
    Keyed(&'a str),
    /// Any HTTP version; answers carry `x-meshpilot-upstream: ADDRESS` of the frontend chosen.
    Probe,
}

/// A listener routing everything to `frontends` by the proxy-key header (see [`LbListener`]).
fn lb_listener(name: &str, port: u16, kind: LbListener) -> Value {
    let mut filters = Vec::new();
    if let LbListener::Keyed(key) = kind {
        filters.push(json!({
            "name": "envoy.filters.http.header_mutation",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"append": {
                    "header": {"key": PROXY_KEY_HEADER, "value": key},
                    "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"
                }}]}
            }
        }));
    }
    filters.push(json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    }));
    let probe = matches!(kind, LbListener::Probe);
    let codec = if probe { "AUTO" } else { "HTTP2" };
    let response_headers = if probe {
        json!([{"header": {"key": "x-meshpilot-upstream", "value": "%UPSTREAM_REMOTE_ADDRESS%"}}])
    } else {
        json!([])
    };
    let route = json!({
        "match": {"prefix": "/"},
        "route": {
            "cluster": "frontends",
            // xDS streams are long-lived.
            "timeout": "0s",
            "hash_policy": [{"header": {"header_name": PROXY_KEY_HEADER}}],
            // A frontend that just died (not yet marked down by the health check): try the next
            // host.
            "retry_policy": {
                "retry_on": "connect-failure,refused-stream,unavailable",
                "num_retries": 3,
                "retry_host_predicate": [{
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                    }
                }],
                "host_selection_retry_max_attempts": 3
            }
        }
    });
    json!({
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": name,
                "codec_type": codec,
                "http2_protocol_options": {},
                // xDS streams may be idle for long.
                "stream_idle_timeout": "0s",
                "route_config": {
                    "name": name,
                    "response_headers_to_add": response_headers,
                    "virtual_hosts": [{"name": "frontends", "domains": ["*"], "routes": [route]}]
                },
                "http_filters": filters
            }
        }]}]
    })
}

/// A real Envoy load-balancing xDS streams over the frontends by consistent hashing of the
/// `x-meshpilot-proxy-key` header (MAGLEV or RING_HASH, endpoints' `hash_key` = member ids, in
/// member-id order), as deployed in front of meshpilot's frontends: an HTTP/2 listener for
/// proxies that send the header as gRPC metadata, optional keyed listeners that set it, and a
/// probe listener ([`XdsLoadBalancer::route_of`]). Killed on drop.
pub struct XdsLoadBalancer {
    envoy: Envoy,
    port: u16,
    probe_port: u16,
    keyed: Vec<(String, u16)>,
    frontends: Vec<(String, SocketAddr)>,
    client: reqwest::Client,
}

impl XdsLoadBalancer {
    /// A builder with no frontends yet, hashing with Maglev.
    pub fn builder() -> XdsLoadBalancerBuilder {
        XdsLoadBalancerBuilder { frontends: Vec::new(), keyed: Vec::new(), policy: LbPolicy::default() }
    }

    /// The frontend id the load balancer routes proxy key `key` to right now (asked by a plain
    /// HTTP request through a probe listener with the same route; the chosen frontend's address
    /// comes back in a response header). None if no frontend answered.
    pub async fn route_of(&self, key: &str) -> Option<String> {
        let url = format!("http://127.0.0.1:{}/meshpilot-probe", self.probe_port);
        let r = http_request(&self.client, "GET", &url, "", &[(PROXY_KEY_HEADER, key)], None).await.ok()?;
        let upstream: SocketAddr = r.header("x-meshpilot-upstream")?.parse().ok()?;
        self.frontends.iter().find(|(_, a)| *a == upstream).map(|(id, _)| id.clone())
    }

    /// The main listener (proxies send the header themselves).
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
    /// `http://127.0.0.1:PORT` of the main listener.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }
    /// `http://127.0.0.1:PORT` of the listener that sets the proxy key `key` (see
    /// [`XdsLoadBalancerBuilder::keyed_listener`]).
    pub fn keyed_url(&self, key: &str) -> String {
        let (_, port) = self
            .keyed
            .iter()
            .find(|(k, _)| k == key)
            .unwrap_or_else(|| panic!("no keyed listener for {key}; have {:?}", self.keyed));
        format!("http://127.0.0.1:{port}")
    }
    /// The frontends (id, xDS address) in endpoint order.
    pub fn frontends(&self) -> &[(String, SocketAddr)] {
        &self.frontends
    }
    /// The Envoy process.
    pub fn envoy(&self) -> &Envoy {
        &self.envoy
    }

    /// Frontends the health check currently passes (`cluster.frontends.membership_healthy`).
    pub async fn healthy(&self) -> u64 {
        self.envoy.stat("cluster.frontends.membership_healthy").await.unwrap_or(0)
    }

    /// Polls until exactly `n` frontends are healthy; panics on timeout.
    pub async fn wait_healthy(&self, n: u64, timeout: Duration) {
        let mut last = 0;
        let ok = self
            .envoy
            .wait_for(timeout, async |_| {
                last = self.healthy().await;
                last == n
            })
            .await;
        assert!(ok, "load balancer: {last} healthy frontends after {timeout:?}, expected {n}");
    }
}

impl fmt::Debug for XdsLoadBalancer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "XdsLoadBalancer(127.0.0.1:{} over {:?})", self.port, self.frontends)
    }
}
