//! Duration rules: at least 1ms, in whole milliseconds (Envoy's granularity), and above the floor
//! Envoy's proto validation puts on a field where that floor is higher.
//!
//! Every duration meshpilot sends to Envoy and the `(validate.rules).duration` of its Envoy field
//! (envoy-types' `proto/data-plane-api`), so that nothing accepted here is refused there:
//!
//! | Istio field | Envoy field | Envoy rule | rule here |
//! | --- | --- | --- | --- |
//! | VirtualService `timeout` | `RouteAction.timeout` | none | ≥ 1ms |
//! | `retries.perTryTimeout` | `RetryPolicy.per_try_timeout` | none | ≥ 1ms |
//! | `retries.backoff` | `RetryBackOff.base_interval` | `gt {}` | ≥ 1ms |
//! | `fault.delay.fixedDelay` | `FaultDelay.fixed_delay` | `gt {}` | ≥ 1ms |
//! | DestinationRule `tcp.connectTimeout` | `Cluster.connect_timeout` | `gt {}` | ≥ 1ms |
//! | `tcp.idleTimeout`, `http.idleTimeout` | `HttpProtocolOptions.idle_timeout` | none | ≥ 1ms |
//! | `tcp.maxConnectionDuration` | `HttpProtocolOptions.max_connection_duration` | none | ≥ 1ms |
//! | `outlierDetection.interval`, `baseEjectionTime` | `OutlierDetection.interval`, `base_ejection_time` | `gt {}` | ≥ 1ms |
//! | `loadBalancer.warmupDurationSecs`, `warmup.duration` | `SlowStartConfig.slow_start_window` | none | ≥ 1ms |
//! | `consistentHash.httpCookie.ttl` | `Cookie.ttl` | none (0 is a session cookie) | any |
//! | MeshConfig `connectTimeout` | `Cluster.connect_timeout` | `gt {}` | ≥ 1ms |
//! | MeshConfig `dnsRefreshRate` | `Cluster.dns_refresh_rate` | `gt {nanos: 1000000}` | > 1ms |

use serde_json::Value;

use crate::config::api::Duration;

use super::field_errors::invalid;

const NANOS_PER_MILLI: u128 = 1_000_000;

/// Slack for the float arithmetic of the duration parser, far below a millisecond.
const ROUNDING_SLACK_NANOS: u128 = 10;

/// Checks a duration field: at least 1ms, with millisecond precision.
pub fn check_duration(duration: Duration) -> Result<(), String> {
    let nanos = duration.as_std().as_nanos();
    let off_by = (nanos % NANOS_PER_MILLI).min(NANOS_PER_MILLI - nanos % NANOS_PER_MILLI);
    if nanos + ROUNDING_SLACK_NANOS < NANOS_PER_MILLI {
        Err(invalid(duration.to_string(), "must be a valid duration greater than 1ms"))
    } else if off_by > ROUNDING_SLACK_NANOS {
        Err(invalid(duration.to_string(), "only durations to ms precision are supported"))
    } else {
        Ok(())
    }
}

/// Checks a duration Envoy requires to be strictly greater than `floor` (a `gt` rule above 1ms),
/// after the rules every duration follows.
pub fn check_duration_above(duration: Duration, floor: std::time::Duration) -> Result<(), String> {
    check_duration(duration)?;
    if duration.as_std() <= floor {
        let floor = Duration(floor);
        return Err(invalid(
            duration.to_string(),
            format!("must be greater than {floor} (Envoy refuses {floor} or less)"),
        ));
    }
    Ok(())
}

/// Checks an optional duration.
pub(super) fn check_optional(duration: Option<Duration>) -> Result<(), String> {
    duration.map_or(Ok(()), check_duration)
}

/// Checks a duration inside a loosely typed field; absent (null) is fine.
pub(super) fn check_duration_value(value: Option<&Value>) -> Result<(), String> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(text)) => Duration::parse(text).map_err(|e| invalid(text, e)).and_then(check_duration),
        Some(other) => Err(invalid(other, "must be a duration such as \"5s\"")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Result<(), String> {
        check_duration(Duration::parse(text).unwrap())
    }

    #[test]
    fn durations_are_whole_milliseconds_from_1ms() {
        assert!(check("1ms").is_ok());
        assert!(check("1.001s").is_ok());
        assert!(check("300s").is_ok());
        assert!(check("0s").unwrap_err().contains("must be a valid duration greater than 1ms"));
        assert!(check("999us").unwrap_err().contains("greater than 1ms"));
        assert!(check("1500us").unwrap_err().contains("only durations to ms precision are supported"));
    }

    #[test]
    fn floors_above_1ms_are_exclusive() {
        let floor = std::time::Duration::from_millis(1);
        let above = |text: &str| check_duration_above(Duration::parse(text).unwrap(), floor);
        assert!(above("2ms").is_ok());
        assert!(above("1ms").unwrap_err().contains("must be greater than 1ms"));
        assert!(above("0.5ms").unwrap_err().contains("greater than 1ms"));
        assert!(above("0s").is_err());
    }

    #[test]
    fn loosely_typed_durations_are_parsed() {
        assert!(check_duration_value(None).is_ok());
        assert!(check_duration_value(Some(&Value::from("15s"))).is_ok());
        assert!(check_duration_value(Some(&Value::from("0s"))).unwrap_err().contains("greater than 1ms"));
        assert!(check_duration_value(Some(&Value::from("soon"))).is_err());
        assert!(check_duration_value(Some(&Value::from(5))).is_err());
    }
}
