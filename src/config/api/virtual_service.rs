//! `VirtualService` (networking.istio.io): how requests to a host are routed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Duration, Labels, Percent, PortSelector, StringMatch};

/// The `spec` of a VirtualService.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualService {
    /// Destination hosts the rules apply to.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// Gateways (and `mesh`) the rules apply to; empty means `mesh`.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// HTTP rules, first match wins.
    #[serde(default)]
    pub http: Vec<HttpRoute>,
    /// TLS passthrough rules (by SNI).
    #[serde(default)]
    pub tls: Vec<TlsRoute>,
    /// Opaque TCP rules.
    #[serde(default)]
    pub tcp: Vec<TcpRoute>,
    /// Namespaces this VirtualService is visible to.
    #[serde(default)]
    pub export_to: Vec<String>,
}

/// One HTTP rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRoute {
    /// Rule name, used in Envoy's route name.
    #[serde(default)]
    pub name: String,
    /// Conditions (ORed); empty matches everything.
    #[serde(default, rename = "match")]
    pub matches: Vec<HttpMatchRequest>,
    /// Weighted destinations.
    #[serde(default)]
    pub route: Vec<HttpRouteDestination>,
    /// Redirect instead of forwarding.
    #[serde(default)]
    pub redirect: Option<HttpRedirect>,
    /// Answer directly instead of forwarding.
    #[serde(default)]
    pub direct_response: Option<HttpDirectResponse>,
    /// Delegation to another VirtualService (accepted, not routed).
    #[serde(default)]
    pub delegate: Option<serde_json::Value>,
    /// Path/authority rewrite before forwarding.
    #[serde(default)]
    pub rewrite: Option<HttpRewrite>,
    /// Overall request timeout.
    #[serde(default)]
    pub timeout: Option<Duration>,
    /// Retry policy.
    #[serde(default)]
    pub retries: Option<HttpRetry>,
    /// Fault injection.
    #[serde(default)]
    pub fault: Option<HttpFaultInjection>,
    /// Traffic mirroring target.
    #[serde(default)]
    pub mirror: Option<Destination>,
    /// Share of traffic mirrored.
    #[serde(default)]
    pub mirror_percentage: Option<Percent>,
    /// Deprecated integer mirror percentage.
    #[serde(default)]
    pub mirror_percent: Option<u32>,
    /// Several mirror targets.
    #[serde(default)]
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// CORS policy.
    #[serde(default)]
    pub cors_policy: Option<CorsPolicy>,
    /// Header manipulation.
    #[serde(default)]
    pub headers: Option<Headers>,
}

/// Match conditions of an HTTP rule (ANDed).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpMatchRequest {
    /// Match name, appended to the route name.
    #[serde(default)]
    pub name: String,
    /// Path match.
    #[serde(default)]
    pub uri: Option<StringMatch>,
    /// Scheme match.
    #[serde(default)]
    pub scheme: Option<StringMatch>,
    /// Method match.
    #[serde(default)]
    pub method: Option<StringMatch>,
    /// Authority (Host) match.
    #[serde(default)]
    pub authority: Option<StringMatch>,
    /// Header matches by name.
    #[serde(default)]
    pub headers: BTreeMap<String, StringMatch>,
    /// Port the request arrived on.
    #[serde(default)]
    pub port: Option<u32>,
    /// Labels of the client workload.
    #[serde(default)]
    pub source_labels: Labels,
    /// Gateways this match applies to.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// Query parameter matches.
    #[serde(default)]
    pub query_params: BTreeMap<String, StringMatch>,
    /// Case-insensitive uri match.
    #[serde(default)]
    pub ignore_uri_case: bool,
    /// Headers that must not match.
    #[serde(default)]
    pub without_headers: BTreeMap<String, StringMatch>,
    /// Namespace of the client workload.
    #[serde(default)]
    pub source_namespace: String,
    /// Stat prefix (accepted, unused).
    #[serde(default)]
    pub stat_prefix: String,
}

/// A weighted destination of an HTTP rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteDestination {
    /// Where to send the request.
    #[serde(default)]
    pub destination: Option<Destination>,
    /// Relative weight (0–100 when several destinations).
    #[serde(default)]
    pub weight: Option<i32>,
    /// Header manipulation for this destination.
    #[serde(default)]
    pub headers: Option<Headers>,
}

/// A service (and optional subset and port) requests are sent to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Destination {
    /// Service hostname (short names are qualified with the VirtualService's namespace).
    #[serde(default)]
    pub host: String,
    /// DestinationRule subset name.
    #[serde(default)]
    pub subset: String,
    /// Service port; needed when the service has several.
    #[serde(default)]
    pub port: Option<PortSelector>,
}

/// A mirror target with its own percentage.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpMirrorPolicy {
    /// Target.
    #[serde(default)]
    pub destination: Option<Destination>,
    /// Share mirrored.
    #[serde(default)]
    pub percentage: Option<Percent>,
}

/// An HTTP redirect.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRedirect {
    /// New path.
    #[serde(default)]
    pub uri: String,
    /// New authority.
    #[serde(default)]
    pub authority: String,
    /// New port.
    #[serde(default)]
    pub port: Option<u32>,
    /// FROM_PROTOCOL_DEFAULT or FROM_REQUEST_PORT.
    #[serde(default)]
    pub derive_port: Option<String>,
    /// New scheme.
    #[serde(default)]
    pub scheme: String,
    /// Status code (default 301).
    #[serde(default)]
    pub redirect_code: Option<u32>,
}

/// A direct response.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpDirectResponse {
    /// Status code.
    #[serde(default)]
    pub status: u32,
    /// Body.
    #[serde(default)]
    pub body: Option<HttpBody>,
}

/// Body of a direct response.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpBody {
    /// Text body.
    #[serde(default)]
    pub string: Option<String>,
    /// Base64 body.
    #[serde(default)]
    pub bytes: Option<String>,
}

/// Path/authority rewrite.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRewrite {
    /// Replaces the matched prefix (or the whole path for exact/regex matches).
    #[serde(default)]
    pub uri: String,
    /// New authority.
    #[serde(default)]
    pub authority: String,
    /// Regex rewrite of the path.
    #[serde(default)]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

/// Regex rewrite.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegexRewrite {
    /// RE2 pattern.
    #[serde(default, rename = "match")]
    pub pattern: String,
    /// Substitution.
    #[serde(default)]
    pub rewrite: String,
}

/// Retry policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRetry {
    /// Number of retries.
    #[serde(default)]
    pub attempts: i32,
    /// Timeout per try.
    #[serde(default)]
    pub per_try_timeout: Option<Duration>,
    /// Envoy retry conditions, comma separated (and status codes).
    #[serde(default)]
    pub retry_on: String,
    /// Retry in other localities.
    #[serde(default)]
    pub retry_remote_localities: Option<bool>,
    /// Retry on connect failures that were never sent (accepted).
    #[serde(default)]
    pub retry_ignore_previous_hosts: Option<bool>,
    /// Backoff (accepted).
    #[serde(default)]
    pub backoff: Option<Duration>,
}

/// Fault injection.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpFaultInjection {
    /// Delay before forwarding.
    #[serde(default)]
    pub delay: Option<FaultDelay>,
    /// Abort with an error.
    #[serde(default)]
    pub abort: Option<FaultAbort>,
}

/// Fault delay.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultDelay {
    /// Fixed delay.
    #[serde(default)]
    pub fixed_delay: Option<Duration>,
    /// Exponential delay (not supported by Istio either).
    #[serde(default)]
    pub exponential_delay: Option<Duration>,
    /// Share of requests delayed.
    #[serde(default)]
    pub percentage: Option<Percent>,
    /// Deprecated integer percentage.
    #[serde(default)]
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultAbort {
    /// HTTP status returned.
    #[serde(default)]
    pub http_status: Option<i32>,
    /// gRPC status returned.
    #[serde(default)]
    pub grpc_status: Option<String>,
    /// HTTP/2 error (accepted).
    #[serde(default)]
    pub http2_error: Option<String>,
    /// Share of requests aborted.
    #[serde(default)]
    pub percentage: Option<Percent>,
}

/// CORS policy.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CorsPolicy {
    /// Allowed origins.
    #[serde(default)]
    pub allow_origins: Vec<StringMatch>,
    /// Deprecated exact origins.
    #[serde(default)]
    pub allow_origin: Vec<String>,
    /// Allowed methods.
    #[serde(default)]
    pub allow_methods: Vec<String>,
    /// Allowed headers.
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Exposed headers.
    #[serde(default)]
    pub expose_headers: Vec<String>,
    /// Preflight cache duration.
    #[serde(default)]
    pub max_age: Option<Duration>,
    /// Allow credentials.
    #[serde(default)]
    pub allow_credentials: Option<bool>,
    /// FORWARD or IGNORE (accepted).
    #[serde(default)]
    pub unmatched_preflights: Option<String>,
}

/// Header manipulation for requests and responses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Headers {
    /// Applied to the request before forwarding.
    #[serde(default)]
    pub request: Option<HeaderOperations>,
    /// Applied to the response before returning.
    #[serde(default)]
    pub response: Option<HeaderOperations>,
}

/// Set, add and remove operations.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderOperations {
    /// Overwrite.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Append.
    #[serde(default)]
    pub add: BTreeMap<String, String>,
    /// Remove.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A TLS (SNI) rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsRoute {
    /// Conditions.
    #[serde(default, rename = "match")]
    pub matches: Vec<TlsMatchAttributes>,
    /// Destinations.
    #[serde(default)]
    pub route: Vec<RouteDestination>,
}

/// TLS match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsMatchAttributes {
    /// SNI values.
    #[serde(default)]
    pub sni_hosts: Vec<String>,
    /// Destination CIDRs.
    #[serde(default)]
    pub destination_subnets: Vec<String>,
    /// Port.
    #[serde(default)]
    pub port: Option<u32>,
    /// Client labels.
    #[serde(default)]
    pub source_labels: Labels,
    /// Gateways.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// Client namespace.
    #[serde(default)]
    pub source_namespace: String,
}

/// A TCP rule.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TcpRoute {
    /// Conditions.
    #[serde(default, rename = "match")]
    pub matches: Vec<L4MatchAttributes>,
    /// Destinations.
    #[serde(default)]
    pub route: Vec<RouteDestination>,
}

/// L4 match.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct L4MatchAttributes {
    /// Destination CIDRs.
    #[serde(default)]
    pub destination_subnets: Vec<String>,
    /// Port.
    #[serde(default)]
    pub port: Option<u32>,
    /// Client labels.
    #[serde(default)]
    pub source_labels: Labels,
    /// Gateways.
    #[serde(default)]
    pub gateways: Vec<String>,
    /// Client namespace.
    #[serde(default)]
    pub source_namespace: String,
}

/// A weighted L4 destination.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteDestination {
    /// Target.
    #[serde(default)]
    pub destination: Option<Destination>,
    /// Weight.
    #[serde(default)]
    pub weight: Option<i32>,
}
