//! The config files a scale-out [`Cluster`](super::Cluster) serves: a gateway and a sidecar
//! routing to the three `reviews` backends, rewritten as a test edits the mesh.

use std::path::Path;

use super::{HOST, SHOP, SIM_NAMESPACES};
use crate::common::backend::Backend;
use crate::common::files::write_atomic;
use crate::common::istio::{dedent, destination_rule, documents, gateway, service_entry, sidecar_resource};

/// The backends of `reviews.shop`: two of version v1, one of v2.
pub struct Backends {
    /// `reviews-v1a`, version v1.
    pub v1a: Backend,
    /// `reviews-v1b`, version v1.
    pub v1b: Backend,
    /// `reviews-v2`, version v2.
    pub v2: Backend,
}

impl Backends {
    /// Starts the three backends.
    pub fn start() -> Backends {
        Backends { v1a: Backend::new("reviews-v1a"), v1b: Backend::new("reviews-v1b"), v2: Backend::new("reviews-v2") }
    }
}

/// What the edited files say: the routes' name and weights, and which backends are endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshState {
    /// Name of the one HTTP route of both VirtualServices.
    pub route: String,
    /// Weights of subsets v1 and v2.
    pub weights: (u32, u32),
    /// Endpoints of reviews: v1a, v1b, v2.
    pub endpoints: (bool, bool, bool),
}

impl MeshState {
    /// All traffic to v1, only v1a an endpoint.
    pub fn initial() -> MeshState {
        MeshState { route: "initial".into(), weights: (100, 0), endpoints: (true, false, false) }
    }
}

/// `gateway.yaml`: Gateway `shop/gw` on the gateway port and Sidecar `shop/default` (egress on the
/// sidecar port). `services.yaml`: ServiceEntry and DestinationRule of `reviews.shop` (service
/// port = the sidecar port). `routes.yaml`: the gateway's VirtualService for [`HOST`] and the mesh
/// VirtualService of reviews, one weighted route each. `teams.yaml`: a namespace-private
/// ServiceEntry in each simulated proxy namespace.
pub struct MeshFiles {
    /// The gateway's listener port.
    pub gw_port: u16,
    /// The sidecar's egress listener port, also the service port of reviews.
    pub sidecar_port: u16,
}

impl MeshFiles {
    /// Writes every file for `state`.
    pub fn write_all(&self, dir: &Path, backends: &Backends, state: &MeshState) {
        write_atomic(dir, "gateway.yaml", &documents(&[gateway(self.gw_port), sidecar_resource(self.sidecar_port)]));
        write_atomic(dir, "teams.yaml", &teams_yaml());
        self.write_services(dir, backends, state);
        self.write_routes(dir, state);
    }

    /// Writes `services.yaml` for `state` (its endpoints).
    pub fn write_services(&self, dir: &Path, b: &Backends, state: &MeshState) {
        let (a, bb, c) = state.endpoints;
        let mut eps: Vec<(&Backend, &str)> = Vec::new();
        if a {
            eps.push((&b.v1a, "v1"));
        }
        if bb {
            eps.push((&b.v1b, "v1"));
        }
        if c {
            eps.push((&b.v2, "v2"));
        }
        let text = documents(&[
            service_entry("reviews", self.sidecar_port, &eps),
            destination_rule("reviews", &["v1", "v2"], None),
        ]);
        write_atomic(dir, "services.yaml", &text);
    }

    /// Writes `routes.yaml` for `state` (its route name and weights).
    pub fn write_routes(&self, dir: &Path, state: &MeshState) {
        write_atomic(dir, "routes.yaml", &routes_yaml(state));
    }
}

/// Both VirtualServices (gateway and mesh) with one route named and weighted as `state` says.
fn routes_yaml(state: &MeshState) -> String {
    let http = format!(
        "  http:\n  - name: {}\n    route:\n    - destination: {{host: reviews.{SHOP}.svc.cluster.local, subset: v1}}\n      \
         weight: {}\n    - destination: {{host: reviews.{SHOP}.svc.cluster.local, subset: v2}}\n      weight: {}\n",
        state.route, state.weights.0, state.weights.1
    );
    let gw = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: shop, namespace: {SHOP}}}\nspec:\n  \
         hosts: [{HOST}]\n  gateways: [{SHOP}/gw]\n{http}"
    );
    let mesh = format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: reviews, namespace: {SHOP}}}\nspec:\n  \
         hosts: [reviews.{SHOP}.svc.cluster.local]\n{http}"
    );
    documents(&[gw, mesh])
}

/// A namespace-private ServiceEntry in each simulated proxy namespace.
fn teams_yaml() -> String {
    let docs: Vec<String> = SIM_NAMESPACES
        .iter()
        .enumerate()
        .map(|(i, ns)| {
            dedent(&format!(
                r#"
                apiVersion: networking.istio.io/v1
                kind: ServiceEntry
                metadata: {{name: svc, namespace: {ns}}}
                spec:
                  hosts: [svc.{ns}.svc.cluster.local]
                  exportTo: ["."]
                  location: MESH_INTERNAL
                  resolution: STATIC
                  ports: [{{number: 8080, name: http, protocol: HTTP}}]
                  endpoints: [{{address: 10.200.{i}.1}}, {{address: 10.200.{i}.2}}]
                "#
            ))
        })
        .collect();
    documents(&docs)
}
