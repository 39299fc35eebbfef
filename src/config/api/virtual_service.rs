//! `VirtualService` (networking.istio.io): how requests to a host are routed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Duration, Labels, Percent, PortSelector, StringMatch};

/// The `spec` of a VirtualService.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct VirtualService {
    /// Destination hosts the rules apply to.
    pub hosts: Vec<String>,
    /// Gateways (and `mesh`) the rules apply to; empty means `mesh`.
    pub gateways: Vec<String>,
    /// HTTP rules, first match wins.
    pub http: Vec<HttpRoute>,
    /// TLS passthrough rules (by SNI).
    pub tls: Vec<TlsRoute>,
    /// Opaque TCP rules.
    pub tcp: Vec<TcpRoute>,
    /// Namespaces this VirtualService is visible to.
    pub export_to: Vec<String>,
}

/// One HTTP rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRoute {
    /// Rule name, used in Envoy's route name.
    pub name: String,
    /// Conditions (ORed); empty matches everything.
    #[serde(rename = "match")]
    pub matches: Vec<HttpMatchRequest>,
    /// Weighted destinations.
    pub route: Vec<HttpRouteDestination>,
    /// Redirect instead of forwarding.
    pub redirect: Option<HttpRedirect>,
    /// Answer directly instead of forwarding.
    pub direct_response: Option<HttpDirectResponse>,
    /// Delegation to another VirtualService, whose HTTP rules are merged in place of this one.
    pub delegate: Option<Delegate>,
    /// Path/authority rewrite before forwarding.
    pub rewrite: Option<HttpRewrite>,
    /// Overall request timeout.
    pub timeout: Option<Duration>,
    /// Retry policy.
    pub retries: Option<HttpRetry>,
    /// Fault injection.
    pub fault: Option<HttpFaultInjection>,
    /// Traffic mirroring target.
    pub mirror: Option<Destination>,
    /// Share of traffic mirrored.
    pub mirror_percentage: Option<Percent>,
    /// Deprecated integer mirror percentage.
    pub mirror_percent: Option<u32>,
    /// Several mirror targets.
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// CORS policy.
    pub cors_policy: Option<CorsPolicy>,
    /// Header manipulation.
    pub headers: Option<Headers>,
}

/// The delegate VirtualService an HTTP rule hands its traffic to.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Delegate {
    /// The delegate's name.
    pub name: String,
    /// The delegate's namespace; empty means the root's.
    pub namespace: String,
}

/// Match conditions of an HTTP rule (ANDed).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpMatchRequest {
    /// Match name, appended to the route name.
    pub name: String,
    /// Path match.
    pub uri: Option<StringMatch>,
    /// Scheme match.
    pub scheme: Option<StringMatch>,
    /// Method match.
    pub method: Option<StringMatch>,
    /// Authority (Host) match.
    pub authority: Option<StringMatch>,
    /// Header matches by name.
    pub headers: BTreeMap<String, StringMatch>,
    /// Port the request arrived on.
    pub port: Option<u32>,
    /// Labels of the client workload.
    pub source_labels: Labels,
    /// Gateways this match applies to.
    pub gateways: Vec<String>,
    /// Query parameter matches.
    pub query_params: BTreeMap<String, StringMatch>,
    /// Case-insensitive uri match.
    pub ignore_uri_case: bool,
    /// Headers that must not match.
    pub without_headers: BTreeMap<String, StringMatch>,
    /// Namespace of the client workload.
    pub source_namespace: String,
    /// Stat prefix (accepted, unused).
    pub stat_prefix: String,
}

/// A weighted destination of an HTTP rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRouteDestination {
    /// Where to send the request.
    pub destination: Option<Destination>,
    /// Relative weight (0–100 when several destinations).
    pub weight: Option<i32>,
    /// Header manipulation for this destination.
    pub headers: Option<Headers>,
}

/// A service (and optional subset and port) requests are sent to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Destination {
    /// Service hostname (short names are qualified with the VirtualService's namespace).
    pub host: String,
    /// DestinationRule subset name.
    pub subset: String,
    /// Service port; needed when the service has several.
    pub port: Option<PortSelector>,
}

/// A mirror target with its own percentage.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpMirrorPolicy {
    /// Target.
    pub destination: Option<Destination>,
    /// Share mirrored.
    pub percentage: Option<Percent>,
}

/// An HTTP redirect.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRedirect {
    /// New path.
    pub uri: String,
    /// New authority.
    pub authority: String,
    /// New port.
    pub port: Option<u32>,
    /// FROM_PROTOCOL_DEFAULT or FROM_REQUEST_PORT.
    pub derive_port: Option<String>,
    /// New scheme.
    pub scheme: String,
    /// Status code (default 301).
    pub redirect_code: Option<u32>,
}

/// A direct response.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpDirectResponse {
    /// Status code.
    pub status: u32,
    /// Body.
    pub body: Option<HttpBody>,
}

/// Body of a direct response.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpBody {
    /// Text body.
    pub string: Option<String>,
    /// Base64 body.
    pub bytes: Option<String>,
}

/// Path/authority rewrite.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRewrite {
    /// Replaces the matched prefix (or the whole path for exact/regex matches).
    pub uri: String,
    /// New authority.
    pub authority: String,
    /// Regex rewrite of the path.
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// Regex rewrite.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RegexRewrite {
    /// RE2 pattern.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Substitution.
    pub rewrite: String,
}

/// Retry policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpRetry {
    /// Number of retries.
    pub attempts: i32,
    /// Timeout per try.
    pub per_try_timeout: Option<Duration>,
    /// Envoy retry conditions, comma separated (and status codes).
    pub retry_on: String,
    /// Retry in other localities.
    pub retry_remote_localities: Option<bool>,
    /// Retry on connect failures that were never sent (accepted).
    pub retry_ignore_previous_hosts: Option<bool>,
    /// Backoff (accepted).
    pub backoff: Option<Duration>,
}

/// Fault injection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HttpFaultInjection {
    /// Delay before forwarding.
    pub delay: Option<FaultDelay>,
    /// Abort with an error.
    pub abort: Option<FaultAbort>,
}

/// Fault delay.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FaultDelay {
    /// Fixed delay.
    pub fixed_delay: Option<Duration>,
    /// Exponential delay (not supported by Istio either).
    pub exponential_delay: Option<Duration>,
    /// Share of requests delayed.
    pub percentage: Option<Percent>,
    /// Deprecated integer percentage.
    pub percent: Option<i32>,
}

/// gRPC status names in code order: what `fault.abort.grpcStatus` may name.
pub const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The code of a gRPC status given by name (any case) or number.
pub fn grpc_status_code(name: &str) -> Option<u32> {
    let upper = name.to_ascii_uppercase();
    GRPC_STATUS_NAMES.iter().position(|c| *c == upper).and_then(|i| u32::try_from(i).ok()).or_else(|| name.parse().ok())
}

/// Fault abort.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FaultAbort {
    /// HTTP status returned.
    pub http_status: Option<i32>,
    /// gRPC status returned.
    pub grpc_status: Option<String>,
    /// HTTP/2 error (accepted).
    pub http2_error: Option<String>,
    /// Share of requests aborted.
    pub percentage: Option<Percent>,
}

/// CORS policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct CorsPolicy {
    /// Allowed origins.
    pub allow_origins: Vec<StringMatch>,
    /// Deprecated exact origins.
    pub allow_origin: Vec<String>,
    /// Allowed methods.
    pub allow_methods: Vec<String>,
    /// Allowed headers.
    pub allow_headers: Vec<String>,
    /// Exposed headers.
    pub expose_headers: Vec<String>,
    /// Preflight cache duration.
    pub max_age: Option<Duration>,
    /// Allow credentials.
    pub allow_credentials: Option<bool>,
    /// FORWARD or IGNORE (accepted).
    pub unmatched_preflights: Option<String>,
}

/// Header manipulation for requests and responses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Headers {
    /// Applied to the request before forwarding.
    pub request: Option<HeaderOperations>,
    /// Applied to the response before returning.
    pub response: Option<HeaderOperations>,
}

/// Set, add and remove operations.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HeaderOperations {
    /// Overwrite.
    pub set: BTreeMap<String, String>,
    /// Append.
    pub add: BTreeMap<String, String>,
    /// Remove.
    pub remove: Vec<String>,
}

/// A TLS (SNI) rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TlsRoute {
    /// Conditions.
    #[serde(rename = "match")]
    pub matches: Vec<TlsMatchAttributes>,
    /// Destinations.
    pub route: Vec<RouteDestination>,
}

/// TLS match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TlsMatchAttributes {
    /// SNI values.
    pub sni_hosts: Vec<String>,
    /// Destination CIDRs.
    pub destination_subnets: Vec<String>,
    /// Port.
    pub port: Option<u32>,
    /// Client labels.
    pub source_labels: Labels,
    /// Gateways.
    pub gateways: Vec<String>,
    /// Client namespace.
    pub source_namespace: String,
}

/// A TCP rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct TcpRoute {
    /// Conditions.
    #[serde(rename = "match")]
    pub matches: Vec<L4MatchAttributes>,
    /// Destinations.
    pub route: Vec<RouteDestination>,
}

/// L4 match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct L4MatchAttributes {
    /// Destination CIDRs.
    pub destination_subnets: Vec<String>,
    /// Port.
    pub port: Option<u32>,
    /// Client labels.
    pub source_labels: Labels,
    /// Gateways.
    pub gateways: Vec<String>,
    /// Client namespace.
    pub source_namespace: String,
}

/// A weighted L4 destination.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RouteDestination {
    /// Target.
    pub destination: Option<Destination>,
    /// Weight.
    pub weight: Option<i32>,
}
