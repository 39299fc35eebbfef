//! The secure port's own certificate: issued by the CA for istiod's service names
//! (`istiod.<ns>.svc`, `istiod.<ns>.svc.cluster.local`) and any names or addresses configured,
//! and renewed at half its life.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::ca::{CaError, CertificateAuthority};
use super::identity::Identity;
use super::tls::{certified_key, ServingCert, TlsError};

/// Why the serving certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// The CA refused.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// rustls refused the result.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The signing task failed.
    #[error("issuing the serving certificate: {0}")]
    Task(String),
}

/// The names a serving certificate is for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServingNames {
    /// DNS names.
    pub dns: Vec<String>,
    /// IP addresses.
    pub ips: Vec<IpAddr>,
    /// SPIFFE identities (URI SANs) of the serving process (meshpilot's own links).
    pub identities: Vec<Identity>,
}

impl ServingNames {
    /// istiod's names in `namespace` (as pilot-agent expects them), plus `extra` (DNS names or
    /// IP addresses, e.g. the address proxies dial).
    pub fn istiod(namespace: &str, extra: &[String]) -> ServingNames {
        let mut names = ServingNames {
            dns: vec![format!("istiod.{namespace}.svc"), format!("istiod.{namespace}.svc.cluster.local")],
            ips: Vec::new(),
            identities: Vec::new(),
        };
        names.add(extra);
        names
    }

    /// Exactly `hosts` (DNS names or IP addresses).
    pub fn hosts(hosts: &[String]) -> ServingNames {
        let mut names = ServingNames::default();
        names.add(hosts);
        names
    }

    fn add(&mut self, extra: &[String]) {
        let names = self;
        for name in extra {
            match name.parse::<IpAddr>() {
                Ok(ip) if !names.ips.contains(&ip) => names.ips.push(ip),
                Ok(_) => {}
                Err(_) if !names.dns.contains(name) => names.dns.push(name.clone()),
                Err(_) => {}
            }
        }
    }
}

async fn issue(
    ca: &Arc<CertificateAuthority>,
    names: &ServingNames,
    ttl: Duration,
) -> Result<Arc<rustls::sign::CertifiedKey>, ServingError> {
    let (ca, names) = (ca.clone(), names.clone());
    let issued =
        tokio::task::spawn_blocking(move || ca.issue_serving_as(&names.dns, &names.ips, &names.identities, ttl))
            .await
            .map_err(|e| ServingError::Task(e.to_string()))??;
    Ok(certified_key(&issued.chain_pem, &issued.key_pem)?)
}

/// A serving certificate for `names`, valid for the CA's workload TTL, renewed at half its life
/// until `stop` resolves.
pub async fn serving_cert(
    ca: Arc<CertificateAuthority>,
    names: ServingNames,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Arc<ServingCert>, ServingError> {
    let ttl = ca.settings().workload_ttl;
    let cert = ServingCert::new(issue(&ca, &names, ttl).await?);
    info!(dns = ?names.dns, ips = ?names.ips, ?ttl, "serving certificate issued");
    let renewed = cert.clone();
    tokio::spawn(async move {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep(ttl / 2) => {}
            }
            match issue(&ca, &names, ttl).await {
                Ok(key) => renewed.replace(key),
                // The old certificate is good for another half of its life; try again soon.
                Err(e) => warn!(error = %e, "renewing the serving certificate"),
            }
        }
    });
    Ok(cert)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::ca::CaSettings;
    use crate::security::TrustDomain;

    #[tokio::test]
    async fn the_serving_certificate_is_renewed_at_half_its_life() {
        let material = CertificateAuthority::self_signed_material(&TrustDomain::default()).expect("root");
        let settings = CaSettings { workload_ttl: Duration::from_secs(2), max_workload_ttl: Duration::from_secs(2) };
        let ca = Arc::new(CertificateAuthority::new(material, settings).expect("CA"));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let cert = serving_cert(ca, ServingNames::istiod("ns", &[]), async move {
            let _ = stop_rx.await;
        })
        .await
        .expect("issued");
        let first = cert.current();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let renewed = cert.current();
        assert_ne!(first.cert[0], renewed.cert[0], "a new certificate after half its life");
        drop(stop_tx);
    }

    #[test]
    fn istiod_names_and_extra_sans() {
        let names =
            ServingNames::istiod("istio-system", &["10.0.0.5".into(), "meshpilot.example".into(), "10.0.0.5".into()]);
        assert_eq!(
            names.dns,
            ["istiod.istio-system.svc", "istiod.istio-system.svc.cluster.local", "meshpilot.example"]
        );
        assert_eq!(names.ips, [IpAddr::from([10, 0, 0, 5])]);
    }
}
