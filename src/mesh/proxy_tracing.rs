//! The tracing section of Istio's ProxyConfig (`defaultConfig.tracing` in MeshConfig, `tracing`
//! in the PROXY_CONFIG a node sends): how often a proxy samples and which custom tags its spans
//! carry. The tracer itself (Zipkin, Datadog, ...) lives in the proxy's bootstrap, not here.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

/// Istio's ProxyConfig: the fields meshpilot reads (`defaultConfig` in MeshConfig).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyDefaults {
    /// `tracing`.
    pub tracing: Option<ProxyTracing>,
}

/// ProxyConfig `tracing`: sampling, the path tag's length and custom tags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyTracing {
    /// Percentage of requests sampled (0: pilot's default, 1%).
    pub sampling: Sampling,
    /// The longest `http.url` tag (0: Envoy's default).
    pub max_path_tag_length: u32,
    /// Tags by name.
    pub custom_tags: BTreeMap<String, CustomTag>,
    /// Whether Istio's own tags (canonical service, namespace, mesh, cluster, dry-run policies)
    /// are added (absent: yes).
    pub enable_istio_tags: Option<bool>,
}

/// A sampling percentage: a finite number, compared and hashed by its bits (so it can key caches).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Sampling(pub f64);

impl PartialEq for Sampling {
    fn eq(&self, other: &Sampling) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Sampling {}

impl Hash for Sampling {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.to_bits());
    }
}

impl PartialOrd for Sampling {
    fn partial_cmp(&self, other: &Sampling) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Sampling {
    fn cmp(&self, other: &Sampling) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// One custom tag's value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CustomTag {
    /// A fixed value.
    Literal {
        /// The value.
        value: String,
    },
    /// An environment variable of the proxy.
    Environment {
        /// The variable.
        name: String,
        /// The value when it is unset.
        #[serde(default, rename = "defaultValue")]
        default_value: String,
    },
    /// A request header.
    Header {
        /// The header.
        name: String,
        /// The value when it is absent.
        #[serde(default, rename = "defaultValue")]
        default_value: String,
    },
}

/// The most custom tags a node's PROXY_CONFIG may bring; the rest are ignored (each is copied into
/// every connection manager of the proxy).
pub const MAX_NODE_CUSTOM_TAGS: usize = 64;
/// The longest tag name or value a node's PROXY_CONFIG may bring.
const MAX_NODE_TAG_TEXT: usize = 1024;

impl ProxyTracing {
    /// The first field Envoy would refuse, as `(field path, reason)`: a negative sampling, and a
    /// tag without a name or a value (or variable, or header) to read. A sampling above 100 is
    /// taken as 1%, as istiod takes it.
    pub fn validate(&self) -> Result<(), (String, String)> {
        if !(self.sampling.0.is_finite() && self.sampling.0 >= 0.0) {
            return Err(("sampling".into(), format!("{} is not a percentage", self.sampling.0)));
        }
        for (name, tag) in &self.custom_tags {
            let field = format!("customTags.{name}");
            if name.is_empty() {
                return Err(("customTags".into(), "a tag name is empty".into()));
            }
            match tag {
                CustomTag::Literal { value } if value.is_empty() => {
                    return Err((format!("{field}.literal.value"), "empty".into()))
                }
                CustomTag::Environment { name, .. } if name.is_empty() => {
                    return Err((format!("{field}.environment.name"), "empty".into()))
                }
                CustomTag::Header { name, .. } if !is_header_name(name) => {
                    return Err((format!("{field}.header.name"), format!("{name:?} is not an HTTP header name")))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// What a node's PROXY_CONFIG may set, bounded: a negative sampling is dropped (pilot's
    /// default applies), as are invalid or oversized tags and those past [`MAX_NODE_CUSTOM_TAGS`].
    pub fn bounded(mut self) -> ProxyTracing {
        if !(self.sampling.0.is_finite() && self.sampling.0 >= 0.0) {
            self.sampling = Sampling(0.0);
        }
        let tags = std::mem::take(&mut self.custom_tags);
        self.custom_tags = tags
            .into_iter()
            .filter(|(name, tag)| {
                let single = ProxyTracing { custom_tags: [(name.clone(), tag.clone())].into(), ..Default::default() };
                name.len() <= MAX_NODE_TAG_TEXT && tag.text_len() <= MAX_NODE_TAG_TEXT && single.validate().is_ok()
            })
            .take(MAX_NODE_CUSTOM_TAGS)
            .collect();
        self
    }
}

impl CustomTag {
    fn text_len(&self) -> usize {
        match self {
            CustomTag::Literal { value } => value.len(),
            CustomTag::Environment { name, default_value } | CustomTag::Header { name, default_value } => {
                name.len().max(default_value.len())
            }
        }
    }
}

/// An HTTP header name as Envoy's well-known-header rule takes it: a token, lowercase or not.
fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> ProxyTracing {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn reads_istio_field_names() {
        let t = parse(
            "sampling: 12.5\nmaxPathTagLength: 99\nenableIstioTags: false\ncustomTags:\n  team: {literal: {value: payments}}\n  \
             pod: {environment: {name: POD_NAME, defaultValue: none}}\n  user: {header: {name: x-user}}\n",
        );
        assert_eq!(t.sampling, Sampling(12.5));
        assert_eq!(t.max_path_tag_length, 99);
        assert_eq!(t.enable_istio_tags, Some(false));
        assert_eq!(t.custom_tags["team"], CustomTag::Literal { value: "payments".into() });
        assert_eq!(
            t.custom_tags["pod"],
            CustomTag::Environment { name: "POD_NAME".into(), default_value: "none".into() }
        );
        assert_eq!(t.custom_tags["user"], CustomTag::Header { name: "x-user".into(), default_value: String::new() });
        assert_eq!(t.validate(), Ok(()));
    }

    #[test]
    fn refuses_what_envoy_would_refuse() {
        for (yaml, field) in [
            ("sampling: -1", "sampling"),
            ("customTags: {a: {literal: {value: ''}}}", "customTags.a.literal.value"),
            ("customTags: {a: {environment: {name: ''}}}", "customTags.a.environment.name"),
            ("customTags: {a: {header: {name: 'x y'}}}", "customTags.a.header.name"),
        ] {
            assert_eq!(parse(yaml).validate().map_err(|(f, _)| f), Err(field.to_string()), "{yaml}");
        }
    }

    #[test]
    fn a_node_cannot_bring_invalid_or_unbounded_tags() {
        let mut t = parse("sampling: -3\ncustomTags: {bad: {header: {name: 'a b'}}, good: {literal: {value: x}}}");
        for i in 0..200 {
            t.custom_tags.insert(format!("t{i:03}"), CustomTag::Literal { value: "v".into() });
        }
        t.custom_tags.insert("long".into(), CustomTag::Literal { value: "x".repeat(5000) });
        let b = t.bounded();
        assert_eq!(b.sampling, Sampling(0.0), "pilot's default applies");
        assert!(!b.custom_tags.contains_key("bad") && !b.custom_tags.contains_key("long"));
        assert_eq!(b.custom_tags.len(), MAX_NODE_CUSTOM_TAGS);
        assert_eq!(b.validate(), Ok(()));
    }
}
