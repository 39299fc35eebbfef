//! Per-route HTTP policies: fault injection, CORS and header manipulation.

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption, RuntimeFractionalPercent,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{fault_delay, FaultDelay};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as EnvoyCors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{fault_abort, FaultAbort, HttpFault};

use super::http_match::string_matcher;
use super::proto::{bool_value, clamp_u32, duration, percent_of_hundred, percent_of_million};
use crate::config::api::virtual_service::{CorsPolicy, HeaderOperations, Headers, HttpFaultInjection};
use crate::config::api::StringMatch;

/// Header operations for a route or a weighted cluster.
#[derive(Debug, Default)]
pub(super) struct HeaderOps {
    /// Request headers to set or append.
    pub request_add: Vec<HeaderValueOption>,
    /// Request headers to remove.
    pub request_remove: Vec<String>,
    /// Response headers to set or append.
    pub response_add: Vec<HeaderValueOption>,
    /// Response headers to remove.
    pub response_remove: Vec<String>,
    /// A request `:authority`/`host` set, which Envoy applies as a host rewrite.
    pub authority: Option<String>,
}

/// Translates Istio's header operations: `set` overwrites, `add` appends; pseudo headers and
/// `host` cannot be changed by header mutation, so an authority becomes a host rewrite instead.
pub(super) fn header_ops(headers: &Headers) -> HeaderOps {
    let request = headers.request.as_ref();
    let response = headers.response.as_ref();
    let authority_of = |ops: Option<&HeaderOperations>, set: bool| {
        let map = ops.map(|o| if set { &o.set } else { &o.add })?;
        map.iter().rev().find(|(k, _)| is_authority(k)).map(|(_, v)| v.clone())
    };
    HeaderOps {
        request_add: additions(request),
        request_remove: removals(request),
        response_add: additions(response),
        response_remove: removals(response),
        authority: authority_of(request, true).or_else(|| authority_of(request, false)),
    }
}

fn additions(ops: Option<&HeaderOperations>) -> Vec<HeaderValueOption> {
    let Some(ops) = ops else { return Vec::new() };
    let set = ops.set.iter().map(|(k, v)| (k, v, HeaderAppendAction::OverwriteIfExistsOrAdd));
    let add = ops.add.iter().map(|(k, v)| (k, v, HeaderAppendAction::AppendIfExistsOrAdd));
    set.chain(add)
        .filter(|(k, _, _)| !is_internal(k))
        .map(|(k, v, action)| HeaderValueOption {
            header: Some(HeaderValue { key: k.clone(), value: v.clone(), ..Default::default() }),
            append_action: action as i32,
            ..Default::default()
        })
        .collect()
}

fn removals(ops: Option<&HeaderOperations>) -> Vec<String> {
    ops.map(|o| o.remove.iter().filter(|k| !is_internal(k)).cloned().collect()).unwrap_or_default()
}

fn is_internal(key: &str) -> bool {
    key.starts_with(':') || key.eq_ignore_ascii_case("host")
}

fn is_authority(key: &str) -> bool {
    key.eq_ignore_ascii_case(":authority") || key.eq_ignore_ascii_case("host")
}

/// Istio's fault injection → Envoy's per-route `HTTPFault`; `None` when nothing can be injected
/// (exponential delays and HTTP/2 errors are not supported, as in Istio).
pub(super) fn fault(f: &HttpFaultInjection) -> Option<HttpFault> {
    let delay = f.delay.as_ref().and_then(|d| {
        let fixed = d.fixed_delay?;
        let percentage = match (&d.percentage, d.percent) {
            (Some(p), _) => percent_of_million(p),
            (None, percent) => percent_of_hundred(clamp_u32(percent.unwrap_or(0))),
        };
        Some(FaultDelay {
            percentage: Some(percentage),
            fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(duration(fixed.0))),
        })
    });
    let abort = f.abort.as_ref().and_then(|a| {
        let error_type = if let Some(status) = a.http_status {
            fault_abort::ErrorType::HttpStatus(clamp_u32(status))
        } else {
            fault_abort::ErrorType::GrpcStatus(crate::config::api::virtual_service::grpc_status_code(
                a.grpc_status.as_deref()?,
            )?)
        };
        Some(FaultAbort {
            percentage: a.percentage.as_ref().map(percent_of_million),
            error_type: Some(error_type),
            ..Default::default()
        })
    });
    if delay.is_none() && abort.is_none() {
        return None;
    }
    Some(HttpFault { delay, abort, ..Default::default() })
}

/// Istio's CORS policy → Envoy's per-route CORS policy (enabled for 100% of requests).
pub(super) fn cors(c: &CorsPolicy) -> EnvoyCors {
    let origins: Vec<_> = if !c.allow_origins.is_empty() {
        c.allow_origins.iter().map(string_matcher).collect()
    } else {
        c.allow_origin.iter().map(|o| string_matcher(&StringMatch::Exact(o.clone()))).collect()
    };
    EnvoyCors {
        allow_origin_string_match: origins,
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c.max_age.map(|d| d.0.as_secs().to_string()).unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(bool_value),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(percent_of_hundred(100)),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(bool_value(c.unmatched_preflights.as_deref() != Some("IGNORE"))),
        ..Default::default()
    }
}
