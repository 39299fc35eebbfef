//! `meshpilot config diff [--from V] [--to V] [--proxy ID]`: what changed between two snapshots a
//! node holds, in a proxy's generated config resource by resource (or, without a proxy, in the
//! Istio objects). istiod keeps no history to answer this.

use serde_json::Value;

use super::admin_client::get_json;
use super::CtlError;
use crate::snapshot::Version;

/// The node's `/debug/config_diff` answer for `from`..`to` (defaults: the last two snapshots it
/// holds) and `proxy`.
pub async fn fetch(
    admin_url: &str,
    from: Option<&str>,
    to: Option<&str>,
    proxy: Option<&str>,
) -> Result<Value, CtlError> {
    let mut query = Vec::new();
    for (key, version) in [("from", from), ("to", to)] {
        if let Some(v) = version {
            let parsed: Version = v.parse().map_err(|e| CtlError::Argument(format!("--{key}: {e}")))?;
            query.push(format!("{key}={parsed}"));
        }
    }
    if let Some(p) = proxy {
        if p.is_empty() || !p.chars().all(|c| c.is_ascii_alphanumeric() || "~.-_:".contains(c)) {
            return Err(CtlError::Argument(format!("{p:?} is not a proxy name (node id or pod.namespace)")));
        }
        query.push(format!("proxyID={p}"));
    }
    get_json(admin_url, &format!("/debug/config_diff?{}", query.join("&"))).await
}

/// The answer as text: a line per resource (type, name, change) and its changed fields, or a
/// line per Istio object.
pub fn render(diff: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out = match diff.get("proxy") {
        Some(p) => format!("{}: {} -> {}\n", text(p), text(&diff["from"]), text(&diff["to"])),
        None => format!("Istio objects: {} -> {}\n", text(&diff["from"]), text(&diff["to"])),
    };
    let resources = diff["resources"].as_array().or_else(|| diff["objects"].as_array()).cloned().unwrap_or_default();
    if resources.is_empty() {
        out.push_str("  no change\n");
    }
    for r in &resources {
        match r.get("object") {
            Some(object) => out.push_str(&format!("  {:<8} {}\n", text(&r["change"]), text(object))),
            None => {
                let kind = text(&r["type"]).to_uppercase();
                out.push_str(&format!("  {:<8} {kind} {}\n", text(&r["change"]), text(&r["name"])));
                for field in r["fields"].as_array().into_iter().flatten() {
                    out.push_str(&format!("             {}\n", text(field)));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn renders_resources_with_their_fields_and_objects() {
        let d = json!({"proxy": "sidecar~1~a.ns~ns.svc.cluster.local", "from": "1.3", "to": "1.4", "resources": [
            {"type": "rds", "name": "80", "change": "changed", "fields": [".virtual_hosts[0].name: \"a\" -> \"b\""]},
            {"type": "cds", "name": "outbound|80||b", "change": "added"}]});
        assert_eq!(
            render(&d),
            "sidecar~1~a.ns~ns.svc.cluster.local: 1.3 -> 1.4\n  changed  RDS 80\n             \
             .virtual_hosts[0].name: \"a\" -> \"b\"\n  added    CDS outbound|80||b\n"
        );
        let o = json!({"from": "1.1", "to": "1.2", "objects": []});
        assert_eq!(render(&o), "Istio objects: 1.1 -> 1.2\n  no change\n");
    }

    #[tokio::test]
    async fn malformed_versions_and_proxy_names_are_refused_before_asking() {
        let e = fetch("http://127.0.0.1:1", Some("one"), None, None).await.expect_err("refused");
        assert!(e.to_string().contains("--from") && e.to_string().contains("TERM.SEQ"), "{e}");
        let e = fetch("http://127.0.0.1:1", None, None, Some("a&b")).await.expect_err("refused");
        assert!(e.to_string().contains("not a proxy name"), "{e}");
    }
}
