//! Field types shared by several Istio networking kinds.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Labels as Istio writes them (`key: value`), ordered for stable hashing.
pub type Labels = BTreeMap<String, String>;

/// A protobuf/Go style duration ("1.5s", "100ms", "1h30m"), always non-negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(pub std::time::Duration);

impl Duration {
    /// Parses the textual form Istio accepts; see [`Duration`].
    pub fn parse(text: &str) -> Result<Self, String> {
        let s = text.trim();
        if s.is_empty() {
            return Err("duration is empty".into());
        }
        if s.starts_with('-') {
            return Err(format!("duration {text:?} must not be negative"));
        }
        let mut total = 0f64;
        let mut rest = s;
        while !rest.is_empty() {
            let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
            if num_len == 0 {
                return Err(format!("duration {text:?} is not a number followed by a unit"));
            }
            let number: f64 =
                rest[..num_len].parse().map_err(|_| format!("duration {text:?} has an invalid number"))?;
            rest = &rest[num_len..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
            let factor = match &rest[..unit_len] {
                "ns" => 1e-9,
                "us" | "µs" => 1e-6,
                "ms" => 1e-3,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                "" => return Err(format!("duration {text:?} is missing a unit (e.g. \"5s\")")),
                other => return Err(format!("duration {text:?} has unknown unit {other:?}")),
            };
            rest = &rest[unit_len..];
            total += number * factor;
        }
        if !total.is_finite() || total > 315_576_000_000.0 {
            return Err(format!("duration {text:?} is out of range"));
        }
        Ok(Duration(std::time::Duration::from_secs_f64(total)))
    }

    /// The duration as std's type.
    pub fn as_std(self) -> std::time::Duration {
        self.0
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos.is_multiple_of(1_000_000_000) {
            write!(f, "{}s", self.0.as_secs())
        } else if nanos.is_multiple_of(1_000_000) {
            write!(f, "{}ms", self.0.as_millis())
        } else {
            write!(f, "{}s", self.0.as_secs_f64())
        }
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Istio's `StringMatch`: exactly one of exact, prefix or regex (RE2 syntax).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StringMatch {
    /// Exact string match.
    Exact(String),
    /// Prefix match.
    Prefix(String),
    /// RE2 regular expression, matched against the whole value.
    Regex(String),
}

/// Istio's `PortSelector`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PortSelector {
    /// Port number.
    #[serde(default)]
    pub number: u32,
}

/// Istio's `Percent` wrapper (0.0–100.0).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percent {
    /// The percentage.
    #[serde(default)]
    pub value: f64,
}

/// Istio's `WorkloadSelector`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSelector {
    /// Labels a workload must carry to be selected (Sidecar spells the field `labels`).
    #[serde(default, alias = "labels")]
    pub match_labels: Labels,
}

/// A service port as ServiceEntry and Gateway write it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Port number (1–65535).
    #[serde(default)]
    pub number: u32,
    /// Protocol: HTTP, HTTPS, GRPC, HTTP2, MONGO, TCP, TLS.
    #[serde(default)]
    pub protocol: String,
    /// Port name, unique within the object.
    #[serde(default)]
    pub name: String,
    /// Port on the endpoint that receives traffic, when it differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

/// Application protocol of a port, as Istio infers it from `protocol` (or the name prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Protocol {
    /// HTTP/1.1 (or upgraded).
    Http,
    /// HTTP/2 cleartext.
    Http2,
    /// gRPC (HTTP/2).
    Grpc,
    /// TLS terminated at the gateway carrying HTTP.
    Https,
    /// TLS passthrough or originated.
    Tls,
    /// Opaque TCP.
    Tcp,
    /// MongoDB: TCP behind Envoy's Mongo proxy filter, as istiod adds it.
    Mongo,
    /// MySQL, treated as TCP (istiod's MySQL filter is off by default).
    Mysql,
    /// Redis, treated as TCP (istiod's Redis filter is off by default).
    Redis,
    /// Unknown protocol, treated as TCP.
    Unsupported,
}

impl Protocol {
    /// Parses Istio's protocol names, case-insensitively.
    pub fn parse(name: &str) -> Protocol {
        match name.to_ascii_uppercase().as_str() {
            "HTTP" => Protocol::Http,
            "HTTP2" => Protocol::Http2,
            "GRPC" | "GRPC-WEB" => Protocol::Grpc,
            "HTTPS" => Protocol::Https,
            "TLS" => Protocol::Tls,
            "TCP" => Protocol::Tcp,
            "MONGO" => Protocol::Mongo,
            "MYSQL" => Protocol::Mysql,
            "REDIS" => Protocol::Redis,
            _ => Protocol::Unsupported,
        }
    }

    /// Whether Envoy routes this protocol with the HTTP connection manager.
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Http2 | Protocol::Grpc)
    }

    /// Whether the upstream speaks HTTP/2.
    pub fn is_http2(self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }

    /// Istio's canonical protocol name.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "HTTP",
            Protocol::Http2 => "HTTP2",
            Protocol::Grpc => "GRPC",
            Protocol::Https => "HTTPS",
            Protocol::Tls => "TLS",
            Protocol::Tcp => "TCP",
            Protocol::Mongo => "MONGO",
            Protocol::Mysql => "MYSQL",
            Protocol::Redis => "REDIS",
            Protocol::Unsupported => "UNSUPPORTED",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_go() {
        assert_eq!(Duration::parse("5s").unwrap().0.as_millis(), 5000);
        assert_eq!(Duration::parse("1.5s").unwrap().0.as_millis(), 1500);
        assert_eq!(Duration::parse("100ms").unwrap().0.as_millis(), 100);
        assert_eq!(Duration::parse("1h30m").unwrap().0.as_secs(), 5400);
        assert!(Duration::parse("5").is_err());
        assert!(Duration::parse("-1s").is_err());
        assert!(Duration::parse("1x").is_err());
        assert_eq!(Duration::parse("1500ms").unwrap().to_string(), "1500ms");
    }
}
