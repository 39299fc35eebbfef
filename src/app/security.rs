//! The security parts of a serving role: the CA (from plug-in files, the `istio-ca-secret` or a
//! directory), the authenticator of the secure port (client certificates; tokens with
//! Kubernetes), the secure port's serving certificate, and the trust domain followed from the
//! mesh config.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::drain::DrainWatcher;
use crate::security::ca::metrics::CaMetrics;
use crate::security::ca::root_publisher;
use crate::security::ca::{self, CaError, CaSettings, CaSource, CertificateAuthority, RootStore};
use crate::security::link::LinkTls;
use crate::security::serving::{serving_cert, ServingError, ServingNames};
use crate::security::tls::{self, ClientAuth, TlsError};
use crate::security::{Authenticator, Identity, SharedTrustDomain, TokenReviewer, TrustDomain};
use crate::snapshot::SnapshotReader;
use crate::telemetry::metrics::Registry;

/// Default plug-in CA directory (Istio mounts the `cacerts` Secret there).
pub const DEFAULT_PLUGIN_DIR: &str = "./etc/cacerts";
/// Default directory of a self-signed root without Kubernetes, under the working directory.
pub const DEFAULT_ROOT_DIR: &str = "./.meshpilot/ca";

/// How often a frontend looks for the root the ingest leader has not created yet.
const ROOT_RETRY: Duration = Duration::from_secs(2);

/// Why the security parts could not start.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// The CA could not load or create its material.
    #[error(transparent)]
    Ca(#[from] CaError),
    /// The serving certificate could not be made.
    #[error(transparent)]
    Serving(#[from] ServingError),
    /// TLS could not be configured.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The link credentials could not be made.
    #[error("mutual TLS between meshpilot's processes: {0}")]
    Link(String),
    /// The Kubernetes client could not be made.
    #[error("Kubernetes client for the CA: {0}")]
    Kubernetes(String),
}

/// Settings of the CA and the secure xDS port.
#[derive(Debug, Clone)]
pub struct SecuritySettings {
    /// Where the secure port (TLS: ADS and the CA, like istiod's 15012) listens; `None`: off.
    pub secure_xds_addr: Option<SocketAddr>,
    /// Names and addresses the serving certificate carries beside istiod's.
    pub extra_sans: Vec<String>,
    /// Workload certificate lifetimes.
    pub ca: CaSettings,
    /// Istio's plug-in CA directory.
    pub plugin_dir: PathBuf,
    /// Where a self-signed root is kept without Kubernetes.
    pub root_dir: PathBuf,
    /// The control plane's namespace (istiod's names, the `istio-ca-secret`).
    pub namespace: String,
    /// Whether this process creates the `istio-ca-secret` when missing (standalone: yes;
    /// frontends: no, the ingest leader does).
    pub create_root: bool,
    /// Whether the snapshot stream between ingest and frontends uses mutual TLS from the CA.
    pub snapshot_mtls: bool,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        SecuritySettings {
            secure_xds_addr: None,
            extra_sans: Vec::new(),
            ca: CaSettings::default(),
            plugin_dir: DEFAULT_PLUGIN_DIR.into(),
            root_dir: DEFAULT_ROOT_DIR.into(),
            namespace: "istio-system".into(),
            create_root: true,
            snapshot_mtls: false,
        }
    }
}

/// The running CA and the secure port's TLS.
#[derive(Clone)]
pub struct Security {
    /// The CA.
    pub ca: Arc<CertificateAuthority>,
    /// The secure port's authenticator.
    pub authn: Arc<Authenticator>,
    /// TLS of the secure port.
    pub tls: Arc<rustls::ServerConfig>,
    /// The CA's metrics (istiod's `citadel_server_*`).
    pub metrics: CaMetrics,
}

/// Starts the CA (with `kube`: its root in the `istio-ca-secret`, tokens reviewed there) and the
/// secure port's serving certificate; the trust domain follows `snapshots`' mesh config.
pub async fn start(
    settings: &SecuritySettings,
    kube: Option<kube::Client>,
    snapshots: SnapshotReader,
    registry: &Registry,
    drain: &DrainWatcher,
) -> Result<Security, SecurityError> {
    let ca = load_ca(settings, kube.as_ref(), drain).await?;
    start_with_ca(settings, ca, kube, snapshots, registry, drain).await
}

/// As [`start`], with the CA already loaded.
pub async fn start_with_ca(
    settings: &SecuritySettings,
    ca: Arc<CertificateAuthority>,
    kube: Option<kube::Client>,
    snapshots: SnapshotReader,
    registry: &Registry,
    drain: &DrainWatcher,
) -> Result<Security, SecurityError> {
    let trust_domain = SharedTrustDomain::new(TrustDomain::default());
    follow_trust_domain(trust_domain.clone(), snapshots, drain.clone());
    if kube.is_none() {
        info!("no Kubernetes: the secure port authenticates client certificates only (no token review)");
    }
    let authn = Authenticator::new(kube.map(TokenReviewer::new), trust_domain);
    let names = ServingNames::istiod(&settings.namespace, &settings.extra_sans);
    let w = drain.clone();
    let cert = serving_cert(ca.clone(), names, async move { w.draining().await }).await?;
    let roots = ca.material().roots()?;
    let tls = tls::server_config(&roots, cert, ClientAuth::Optional)?;
    Ok(Security { ca, authn, tls, metrics: CaMetrics::register(registry) })
}

/// A Kubernetes client for the CA and token reviews, when a cluster is configured.
pub async fn kube_client(
    cluster: Option<&crate::source::kubernetes::ClusterChoice>,
) -> Result<Option<kube::Client>, SecurityError> {
    match cluster {
        Some(choice) => crate::source::kubernetes::client::connect(choice)
            .await
            .map(Some)
            .map_err(|e| SecurityError::Kubernetes(e.to_string())),
        None => Ok(None),
    }
}

/// Loads the CA's key material as `settings` say (plug-in files; else the `istio-ca-secret` with
/// `kube`, created when `settings.create_root`, waited for otherwise; else `settings.root_dir`).
pub async fn load_ca(
    settings: &SecuritySettings,
    kube: Option<&kube::Client>,
    drain: &DrainWatcher,
) -> Result<Arc<CertificateAuthority>, SecurityError> {
    let root_store = match kube {
        Some(client) => RootStore::Secret {
            client: client.clone(),
            namespace: settings.namespace.clone(),
            create: settings.create_root,
        },
        None => RootStore::Directory(settings.root_dir.clone()),
    };
    let source = CaSource { plugin_dir: settings.plugin_dir.clone(), root_store, trust_domain: TrustDomain::default() };
    let material = loop {
        match ca::load_or_create(&source).await {
            Err(e @ CaError::NotCreatedYet(_)) => {
                info!(reason = %e, "waiting for the CA's root");
                tokio::select! {
                    _ = tokio::time::sleep(ROOT_RETRY) => {}
                    _ = drain.draining() => return Err(e.into()),
                }
            }
            other => break other?,
        }
    };
    Ok(Arc::new(CertificateAuthority::new(material, settings.ca)?))
}

/// The credentials of this process's links (the snapshot stream): a certificate for
/// `spiffe://<trust domain>/ns/<namespace>/sa/<service_account>` from `ca`.
pub async fn link_tls(
    ca: Arc<CertificateAuthority>,
    namespace: &str,
    service_account: &str,
) -> Result<Arc<LinkTls>, SecurityError> {
    let identity = Identity::new(TrustDomain::default(), namespace, service_account)
        .map_err(|e| SecurityError::Link(e.to_string()))?;
    LinkTls::new(ca, identity).await.map_err(|e| SecurityError::Link(e.to_string()))
}

/// Keeps `trust_domain` at the mesh config's `trustDomain` of each new snapshot.
fn follow_trust_domain(trust_domain: SharedTrustDomain, mut snapshots: SnapshotReader, drain: DrainWatcher) {
    tokio::spawn(async move {
        let mut next = snapshots.first().await;
        while let Some(snapshot) = next {
            match TrustDomain::new(&snapshot.mesh.trust_domain) {
                Ok(td) if td != trust_domain.get() => {
                    info!(trust_domain = %td, "identities use the mesh config's trust domain");
                    trust_domain.set(td);
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "mesh config trustDomain ignored"),
            }
            next = tokio::select! {
                s = snapshots.next() => s,
                _ = drain.draining() => None,
            };
        }
    });
}

/// On an ingest node with Kubernetes: loads (or creates) the CA's root in the `istio-ca-secret`
/// and, while `is_leader`, keeps it published in every namespace's `istio-ca-root-cert`.
/// Failures are retried: the CA's root must not stop snapshots.
pub fn keep_root_published(
    client: kube::Client,
    settings: SecuritySettings,
    is_leader: tokio::sync::watch::Receiver<bool>,
    drain: DrainWatcher,
) {
    tokio::spawn(async move {
        let source = CaSource {
            plugin_dir: settings.plugin_dir.clone(),
            root_store: RootStore::Secret {
                client: client.clone(),
                namespace: settings.namespace.clone(),
                create: true,
            },
            trust_domain: TrustDomain::default(),
        };
        let root = loop {
            match ca::load_or_create(&source).await {
                Ok(material) => break material.root_cert,
                Err(e) => warn!(error = %e, "the CA's root is not available; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                _ = drain.draining() => return,
            }
        };
        super::while_leading(is_leader, drain, |stop| root_publisher::run(client.clone(), root.clone(), stop)).await;
    });
}

/// The service accounts (SPIFFE names) ingest nodes and frontends link as.
pub const INGEST_SERVICE_ACCOUNT: &str = "meshpilot-ingest";
/// See [`INGEST_SERVICE_ACCOUNT`].
pub const FRONTEND_SERVICE_ACCOUNT: &str = "meshpilot-frontend";

/// The snapshot server's mutual TLS on an ingest node advertising `advertise_addr`: a
/// certificate for its host, and admission of control-plane peers only.
pub async fn snapshot_server_tls(
    settings: &SecuritySettings,
    kube: Option<&kube::Client>,
    advertise_addr: &str,
    drain: &DrainWatcher,
) -> Result<(Arc<rustls::ServerConfig>, tls::PeerFilter), SecurityError> {
    let ca = load_ca(settings, kube, drain).await?;
    let link = link_tls(ca, &settings.namespace, INGEST_SERVICE_ACCOUNT).await?;
    let host = advertise_addr.rsplit_once(':').map_or(advertise_addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let w = drain.clone();
    let config = link
        .server_config(ServingNames::hosts(&[host]), async move { w.draining().await })
        .await
        .map_err(|e| SecurityError::Link(e.to_string()))?;
    Ok((config, link.same_namespace_only()))
}
