//! What simulated proxies hold, compared resource for resource: a proxy connected all along
//! against a new connection of the same node (to a server built from scratch), with the
//! differences decoded as Envoy's JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use meshpilot::admin::envoy_json::bytes_to_json;
use meshpilot::sim::{HeldResource, SimProxy, SimState};
use meshpilot::xds::TypeUrl;
use serde_json::Value;

/// What one proxy holds: by type, by resource name.
pub type Held = BTreeMap<TypeUrl, BTreeMap<String, HeldResource>>;

/// What `state` holds as Envoy would (what it accepted).
pub fn held(state: &SimState) -> Held {
    state
        .types
        .iter()
        .map(|(t, s)| (*t, s.acked_resources.clone()))
        .filter(|(_, resources)| !resources.is_empty())
        .collect()
}

/// Whether a proxy stopped moving: connected, CDS and LDS accepted, every type it received acked
/// at its last version.
fn quiet(state: &SimState) -> bool {
    state.connected
        && [TypeUrl::Cluster, TypeUrl::Listener].iter().all(|t| state.types.contains_key(t))
        && state.types.values().all(|t| t.acked_version == t.version)
}

/// What each of `proxies` (new connections) holds once none has received anything for
/// `quiet_for`; panics after `timeout`.
pub async fn settled_view(proxies: &[SimProxy], quiet_for: Duration, timeout: Duration) -> Vec<Held> {
    let deadline = Instant::now() + timeout;
    let responses = |p: &[SimProxy]| p.iter().map(|p| p.state().responses()).collect::<Vec<_>>();
    let mut last = responses(proxies);
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = responses(proxies);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= quiet_for && proxies.iter().all(|p| quiet(&p.state())) {
            return proxies.iter().map(|p| held(&p.state())).collect();
        }
        let states: Vec<_> = proxies.iter().map(|p| p.state()).collect();
        assert!(Instant::now() < deadline, "new connections did not settle within {timeout:?}: {states:#?}");
    }
}

/// One resource that differs between what a proxy holds and what a new connection gets.
#[derive(Debug)]
pub struct Mismatch {
    /// The resource type.
    pub type_url: TypeUrl,
    /// The resource name.
    pub name: String,
    /// What the proxy connected all along holds (None: nothing of that name).
    pub held: Option<HeldResource>,
    /// What a new connection gets (None: nothing of that name).
    pub fresh: Option<HeldResource>,
}

/// The resources where `held` and `fresh` differ. Equal hashes are equal; unequal hashes are
/// compared again as JSON, since protobuf maps (`Struct`) encode in no fixed order.
pub fn mismatches(held: &Held, fresh: &Held) -> Vec<Mismatch> {
    let types: BTreeSet<TypeUrl> = held.keys().chain(fresh.keys()).copied().collect();
    let empty = BTreeMap::new();
    let mut out = Vec::new();
    for type_url in types {
        let (a, b) = (held.get(&type_url).unwrap_or(&empty), fresh.get(&type_url).unwrap_or(&empty));
        let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        for name in names {
            let (x, y) = (a.get(name), b.get(name));
            let same = match (x, y) {
                (Some(x), Some(y)) => x.hash == y.hash || decoded(type_url, x) == decoded(type_url, y),
                _ => false,
            };
            if !same {
                out.push(Mismatch { type_url, name: name.clone(), held: x.cloned(), fresh: y.cloned() });
            }
        }
    }
    out
}

/// A held resource as Envoy's JSON (`null` without bytes or when it does not decode).
pub fn decoded(type_url: TypeUrl, resource: &HeldResource) -> Value {
    let full_name = type_url.as_str().trim_start_matches("type.googleapis.com/");
    match &resource.bytes {
        Some(bytes) => bytes_to_json(full_name, bytes).unwrap_or_else(|e| Value::String(format!("undecodable: {e}"))),
        None => Value::Null,
    }
}

/// A readable account of `mismatch`: the two resources as JSON, and the lines that differ.
pub fn describe(mismatch: &Mismatch) -> String {
    let text = |r: &Option<HeldResource>| match r {
        Some(r) => serde_json::to_string_pretty(&decoded(mismatch.type_url, r)).unwrap_or_default(),
        None => "(absent)".to_string(),
    };
    let (held, fresh) = (text(&mismatch.held), text(&mismatch.fresh));
    format!(
        "  {} {}\n  lines that differ (- held by the proxy connected all along, + new connection to a new server):\n{}\n  held:\n{}\n  new connection:\n{}",
        mismatch.type_url,
        mismatch.name,
        line_diff(&held, &fresh),
        indent(&held, 4),
        indent(&fresh, 4)
    )
}

fn indent(text: &str, by: usize) -> String {
    text.lines().map(|l| format!("{:by$}{l}", "")).collect::<Vec<_>>().join("\n")
}

/// A line diff of `a` and `b` (longest common subsequence), only the changed lines with a
/// line of context each side.
pub fn line_diff(a: &str, b: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let mut ops: Vec<(char, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            ops.push((' ', a[i]));
            (i, j) = (i + 1, j + 1);
        } else if j < m && (i == n || lcs[i][j + 1] >= lcs[i + 1][j]) {
            ops.push(('+', b[j]));
            j += 1;
        } else {
            ops.push(('-', a[i]));
            i += 1;
        }
    }
    let near_change = |k: usize| ops[k.saturating_sub(1)..(k + 2).min(ops.len())].iter().any(|(c, _)| *c != ' ');
    let mut out = Vec::new();
    for (k, (c, line)) in ops.iter().enumerate() {
        if near_change(k) {
            out.push(format!("    {c} {line}"));
        } else if out.last().is_some_and(|l: &String| l != "    ...") {
            out.push("    ...".to_string());
        }
    }
    out.join("\n")
}
