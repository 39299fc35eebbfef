//! Kubernetes LabelSelectors, as MeshConfig's `discoverySelectors` writes them.

use serde::{Deserialize, Serialize};

use crate::config::api::Labels;

/// A Kubernetes `LabelSelector`: every `matchLabels` pair and every expression must hold; an
/// empty selector matches everything (as `metav1.LabelSelectorAsSelector` does).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    pub match_labels: Labels,
    /// Set-based requirements.
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One set-based requirement of a [`LabelSelector`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelectorRequirement {
    /// Label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist` (kept as text so validation can name the field).
    pub operator: String,
    /// Values for `In` and `NotIn`; must be empty otherwise.
    pub values: Vec<String>,
}

const OPERATORS: [&str; 4] = ["In", "NotIn", "Exists", "DoesNotExist"];

impl LabelSelector {
    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| r.matches(labels))
    }

    /// The first invalid field (relative path, e.g. `matchExpressions[0].operator`) and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        for (key, value) in &self.match_labels {
            check_key(key).map_err(|r| (format!("matchLabels[{key:?}]"), r))?;
            check_value(value).map_err(|r| (format!("matchLabels[{key:?}]"), r))?;
        }
        for (i, req) in self.match_expressions.iter().enumerate() {
            let at = |field: &str| format!("matchExpressions[{i}].{field}");
            check_key(&req.key).map_err(|r| (at("key"), r))?;
            match req.operator.as_str() {
                "In" | "NotIn" if req.values.is_empty() => {
                    return Err((at("values"), format!("must be specified when `operator` is {:?}", req.operator)))
                }
                "Exists" | "DoesNotExist" if !req.values.is_empty() => {
                    return Err((at("values"), format!("may not be specified when `operator` is {:?}", req.operator)))
                }
                op if !OPERATORS.contains(&op) => {
                    return Err((at("operator"), format!("Unsupported value: {op:?}: supported values: {OPERATORS:?}")))
                }
                _ => {}
            }
            for (j, value) in req.values.iter().enumerate() {
                check_value(value).map_err(|r| (at(&format!("values[{j}]")), r))?;
            }
        }
        Ok(())
    }
}

impl LabelSelectorRequirement {
    fn matches(&self, labels: &Labels) -> bool {
        let value = labels.get(&self.key);
        match self.operator.as_str() {
            "In" => value.is_some_and(|v| self.values.contains(v)),
            "NotIn" => value.is_none_or(|v| !self.values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // Validation refuses other operators; an unknown one selects nothing rather than everything.
            _ => false,
        }
    }
}

/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
fn check_key(key: &str) -> Result<(), String> {
    let (prefix, name) = key.rsplit_once('/').map_or((None, key), |(p, n)| (Some(p), n));
    if let Some(prefix) = prefix {
        let labels_ok = prefix.split('.').all(|l| !l.is_empty() && l.len() <= 63 && is_alnum_dashed(l, false));
        if prefix.is_empty() || prefix.len() > 253 || !labels_ok || prefix.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(format!("invalid label key {key:?}: the prefix must be a lowercase DNS subdomain"));
        }
    }
    if name.is_empty() || name.len() > 63 || !is_alnum_dashed(name, true) {
        return Err(format!(
            "invalid label key {key:?}: the name must be at most 63 characters, alphanumeric, '-', '_' or '.', \
             starting and ending with an alphanumeric character"
        ));
    }
    Ok(())
}

/// A label value: empty, or at most 63 characters as a key's name part.
fn check_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_alnum_dashed(value, true)) {
        return Ok(());
    }
    Err(format!(
        "invalid label value {value:?}: must be at most 63 characters, alphanumeric, '-', '_' or '.', \
         starting and ending with an alphanumeric character"
    ))
}

fn is_alnum_dashed(s: &str, underscore_dot: bool) -> bool {
    let bytes = s.as_bytes();
    let edge_ok = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    edge_ok(bytes.first())
        && edge_ok(bytes.last())
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || (underscore_dot && (*b == b'_' || *b == b'.')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn req(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn match_labels_and_expressions_all_hold() {
        let sel = LabelSelector {
            match_labels: labels(&[("istio-discovery", "enabled")]),
            match_expressions: vec![req("env", "In", &["prod", "staging"]), req("legacy", "DoesNotExist", &[])],
        };
        assert!(sel.matches(&labels(&[("istio-discovery", "enabled"), ("env", "prod")])));
        assert!(!sel.matches(&labels(&[("istio-discovery", "enabled"), ("env", "dev")])));
        assert!(!sel.matches(&labels(&[("istio-discovery", "enabled"), ("env", "prod"), ("legacy", "")])));
        assert!(!sel.matches(&labels(&[("env", "prod")])));
        let not_in = LabelSelector { match_expressions: vec![req("env", "NotIn", &["dev"])], ..Default::default() };
        assert!(not_in.matches(&labels(&[])) && !not_in.matches(&labels(&[("env", "dev")])));
        let exists = LabelSelector { match_expressions: vec![req("team", "Exists", &[])], ..Default::default() };
        assert!(exists.matches(&labels(&[("team", "a")])) && !exists.matches(&labels(&[])));
        assert!(LabelSelector::default().matches(&labels(&[])), "an empty selector matches everything");
    }

    #[test]
    fn validation_names_the_field() {
        let bad = |sel: LabelSelector| sel.validate().unwrap_err().0;
        let exprs = |r| LabelSelector { match_expressions: vec![r], ..Default::default() };
        assert_eq!(bad(exprs(req("env", "Equals", &["a"]))), "matchExpressions[0].operator");
        assert_eq!(bad(exprs(req("env", "In", &[]))), "matchExpressions[0].values");
        assert_eq!(bad(exprs(req("env", "Exists", &["a"]))), "matchExpressions[0].values");
        assert_eq!(bad(exprs(req("-env", "Exists", &[]))), "matchExpressions[0].key");
        assert_eq!(bad(exprs(req("env", "In", &["ok", "not ok"]))), "matchExpressions[0].values[1]");
        assert_eq!(
            bad(LabelSelector { match_labels: labels(&[("Bad/x", "y")]), ..Default::default() }),
            "matchLabels[\"Bad/x\"]"
        );
        assert!(exprs(req("example.com/env", "NotIn", &["a.b_c-d"])).validate().is_ok());
    }
}
