//! Two servers' resources compared field by field: the leaf paths where their (normalised)
//! JSON differs, lists of named objects matched by name so one insertion is one difference.

use std::collections::BTreeSet;

use meshpilot::xds::TypeUrl;
use serde_json::Value;

/// One field that differs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Difference {
    /// Where, e.g. `/filter_chains/[name=x]/filters/0/name`.
    pub path: String,
    /// istiod's value there (None: absent).
    pub istiod: Option<Value>,
    /// meshpilot's value there (None: absent).
    pub meshpilot: Option<Value>,
}

impl Difference {
    /// The path with list positions and names as `*`: what kind of difference it is.
    pub fn kind(&self) -> String {
        generic_path(&self.path)
    }
}

/// `path` with every list index and `[name=…]` as `*`.
pub fn generic_path(path: &str) -> String {
    path.split('/')
        .map(|part| if part.parse::<usize>().is_ok() || part.starts_with("[name=") { "*" } else { part })
        .collect::<Vec<_>>()
        .join("/")
}

/// The short name of a type in reports: CDS, EDS, LDS, RDS, SDS.
pub fn short(type_url: TypeUrl) -> &'static str {
    match type_url {
        TypeUrl::Cluster => "CDS",
        TypeUrl::Endpoint => "EDS",
        TypeUrl::Listener => "LDS",
        TypeUrl::Route => "RDS",
        TypeUrl::Secret => "SDS",
    }
}

/// Every leaf where `istiod` and `meshpilot` differ.
pub fn differences(istiod: &Value, meshpilot: &Value) -> Vec<Difference> {
    let mut out = Vec::new();
    walk("", Some(istiod), Some(meshpilot), &mut out);
    out
}

fn walk(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<Difference>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                walk(&format!("{path}/{k}"), x.get(k), y.get(k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) => match (names(x), names(y)) {
            (Some(nx), Some(ny)) => {
                let all: BTreeSet<&str> = nx.iter().chain(&ny).copied().collect();
                for n in all {
                    let (i, j) = (nx.iter().position(|m| *m == n), ny.iter().position(|m| *m == n));
                    walk(&format!("{path}/[name={n}]"), i.map(|i| &x[i]), j.map(|j| &y[j]), out);
                }
            }
            _ => {
                for i in 0..x.len().max(y.len()) {
                    walk(&format!("{path}/{i}"), x.get(i), y.get(i), out);
                }
            }
        },
        (x, y) if x == y => {}
        (x, y) => out.push(Difference {
            path: if path.is_empty() { "/".into() } else { path.into() },
            istiod: x.cloned(),
            meshpilot: y.cloned(),
        }),
    }
}

/// The `name` of every element, when all are objects with distinct names.
fn names(items: &[Value]) -> Option<Vec<&str>> {
    let names: Vec<&str> = items.iter().map(|v| v.get("name").and_then(Value::as_str)).collect::<Option<_>>()?;
    let distinct: BTreeSet<&&str> = names.iter().collect();
    (distinct.len() == names.len() && !names.is_empty()).then_some(names)
}
