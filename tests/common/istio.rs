//! Istio YAML for tests: the `shop` namespace's objects at [`Backend`]s on 127.0.0.1, and
//! helpers to write YAML indented in raw strings.

use super::backend::Backend;

/// Namespace of every test object except the gateway proxy's.
pub const NS: &str = "shop";

/// Removes the common leading indentation of the non-blank lines and a leading newline, so YAML
/// can be written indented in a raw string.
pub fn dedent(text: &str) -> String {
    let text = text.strip_prefix('\n').unwrap_or(text);
    let indent =
        text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.len() - l.trim_start().len()).min().unwrap_or(0);
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        out.push_str(line.get(indent..).unwrap_or("").trim_end());
        out.push('\n');
    }
    out
}

/// Joins YAML documents into one multi-document file.
pub fn documents(docs: &[String]) -> String {
    docs.iter().map(|d| d.trim_end().to_string()).collect::<Vec<_>>().join("\n---\n") + "\n"
}

/// `NAME.shop.svc.cluster.local`.
pub fn fqdn(name: &str) -> String {
    format!("{name}.{NS}.svc.cluster.local")
}

/// Istio's outbound cluster name for service `NAME` in `shop`: `outbound|PORT|SUBSET|NAME.shop.svc.cluster.local`.
pub fn cluster_name(port: u16, subset: &str, name: &str) -> String {
    format!("outbound|{port}|{subset}|{}", fqdn(name))
}

/// A ServiceEntry for `NAME.shop.svc.cluster.local` on `port` (HTTP, port name `http`) with STATIC
/// endpoints at the given backends (`ports: {http: BACKEND_PORT}`), labelled
/// `{app: NAME, version: VERSION}`.
pub fn service_entry(name: &str, port: u16, endpoints: &[(&Backend, &str)]) -> String {
    let mut eps = String::new();
    for (backend, version) in endpoints {
        eps.push_str(&format!(
            "  - address: {}\n    ports: {{http: {}}}\n    labels: {{app: {name}, version: {version}}}\n",
            backend.ip(),
            backend.port()
        ));
    }
    if eps.is_empty() {
        eps = "  []\n".to_string();
    }
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports:\n  - {{number: {port}, name: http, \
         protocol: HTTP}}\n  endpoints:\n{eps}",
        host = fqdn(name)
    )
}

/// A ServiceEntry for `NAME.shop.svc.cluster.local` on `port` whose endpoints are the
/// WorkloadEntries labelled `app: NAME`.
pub fn service_entry_selecting(name: &str, port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         hosts: [{host}]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports:\n  - {{number: {port}, name: http, \
         protocol: HTTP}}\n  workloadSelector:\n    labels: {{app: {name}}}\n",
        host = fqdn(name)
    )
}

/// A WorkloadEntry `ENTRY` at a backend, labelled `{app: APP, version: VERSION}`.
pub fn workload_entry(entry: &str, app: &str, version: &str, backend: &Backend) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: WorkloadEntry\nmetadata:\n  name: {entry}\n  namespace: {NS}\nspec:\n  \
         address: {}\n  ports: {{http: {}}}\n  labels: {{app: {app}, version: {version}}}\n",
        backend.ip(),
        backend.port()
    )
}

/// A DestinationRule for service `NAME` with subsets selecting `version: SUBSET`, and optionally a
/// `trafficPolicy` given as a one-line YAML flow mapping (e.g. `{loadBalancer: {simple: ROUND_ROBIN}}`).
pub fn destination_rule(name: &str, subsets: &[&str], traffic_policy: Option<&str>) -> String {
    let mut out = format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  \
         host: {}\n",
        fqdn(name)
    );
    if let Some(tp) = traffic_policy {
        out.push_str(&format!("  trafficPolicy: {tp}\n"));
    }
    if !subsets.is_empty() {
        out.push_str("  subsets:\n");
        for s in subsets {
            out.push_str(&format!("  - {{name: {s}, labels: {{version: {s}}}}}\n"));
        }
    }
    out
}

/// Gateway `shop/gw` selecting `istio: ingressgateway`, one plain HTTP server on `port` for all hosts.
pub fn gateway(port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata:\n  name: gw\n  namespace: {NS}\nspec:\n  \
         selector:\n    istio: ingressgateway\n  servers:\n  - port: {{number: {port}, name: http, protocol: HTTP}}\n    \
         hosts: [\"*\"]\n"
    )
}

/// Sidecar `shop/default`: one egress listener bound to 127.0.0.1:`port` (HTTP, no capture)
/// importing the namespace's own hosts.
pub fn sidecar_resource(port: u16) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata:\n  name: default\n  namespace: {NS}\nspec:\n  \
         egress:\n  - port: {{number: {port}, name: http, protocol: HTTP}}\n    bind: 127.0.0.1\n    captureMode: NONE\n    \
         hosts: [\"./*\"]\n"
    )
}

/// A ServiceEntry `name` in `ns` (port 80, HTTP) with STATIC endpoints at `addresses`: config
/// only, for tests that never send traffic there.
pub fn service_entry_in(ns: &str, name: &str, addresses: &[&str]) -> String {
    let eps: Vec<String> = addresses.iter().map(|a| format!("{{address: {a}}}")).collect();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  hosts: [{name}.{ns}.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{{number: 80, name: http, protocol: HTTP}}]\n  endpoints: [{}]\n",
        eps.join(", ")
    )
}

/// The mesh VirtualService of `reviews` in `shop`: requests with `x-user: alice` go to subset
/// v2, the rest to v1.
pub fn reviews_alice_to_v2() -> String {
    dedent(
        r#"
        apiVersion: networking.istio.io/v1
        kind: VirtualService
        metadata: {name: reviews, namespace: shop}
        spec:
          hosts: [reviews.shop.svc.cluster.local]
          http:
          - name: alice
            match:
            - headers:
                x-user: {exact: alice}
            route:
            - destination: {host: reviews, subset: v2}
          - name: default
            route:
            - destination: {host: reviews, subset: v1}
        "#,
    )
}

/// A VirtualService `name` for `hosts`, bound to `gateways` (`mesh` for sidecars), routing all
/// traffic to `host` (optionally a subset).
pub fn route_all(name: &str, hosts: &str, gateways: &str, host: &str, subset: Option<&str>) -> String {
    let subset = subset.map(|s| format!(", subset: {s}")).unwrap_or_default();
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: {name}, namespace: {NS}}}\nspec:\n  \
         hosts: [{hosts}]\n  gateways: [{gateways}]\n  http:\n  - route:\n    - destination: {{host: {host}{subset}}}\n"
    )
}
