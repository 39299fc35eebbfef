//! Istio's validating admission webhook, as istiod serves it on 15017: the Kubernetes API server
//! posts an AdmissionReview for each create or update of an Istio object and gets it allowed or
//! denied with the same parser and validation the config sources apply, so an object meshpilot
//! would reject never reaches the cluster.
//!
//! - [`review`]: the AdmissionReview types and the verdict on one object.
//! - [`server`]: the HTTPS endpoint (`POST /validate`), with a certificate from meshpilot's CA.
//! - [`ca_bundle`]: keeps the ValidatingWebhookConfiguration's `caBundle` at the CA's root.
//! - [`metrics`]: istiod's `galley_validation_*` counters.

pub mod ca_bundle;
pub mod metrics;
pub mod review;
pub mod server;

use std::net::SocketAddr;

/// The Service the API server calls the webhook through (in deploy/: ClusterIP, port 15017).
pub const DEFAULT_SERVICE: &str = "meshpilot-webhook";
/// The ValidatingWebhookConfiguration whose `caBundle` meshpilot keeps.
pub const DEFAULT_CONFIG_NAME: &str = "meshpilot-validator";

/// Where and as what the webhook is served.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// HTTPS listen address (istiod: 0.0.0.0:15017).
    pub addr: SocketAddr,
    /// The Service name the certificate is for: `<service>.<namespace>.svc[.cluster.local]`.
    pub service: String,
    /// Extra DNS names or IP addresses of the certificate.
    pub extra_sans: Vec<String>,
    /// The ValidatingWebhookConfiguration whose `caBundle` is kept (with Kubernetes).
    pub config_name: String,
}

impl WebhookSettings {
    /// The names of the serving certificate for the Service in `namespace`, and the extras.
    pub fn serving_hosts(&self, namespace: &str) -> Vec<String> {
        let mut hosts = vec![
            format!("{}.{namespace}.svc", self.service),
            format!("{}.{namespace}.svc.cluster.local", self.service),
        ];
        hosts.extend(self.extra_sans.iter().cloned());
        hosts
    }
}
