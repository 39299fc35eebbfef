//! The security parts of a serving role: the CA (from plug-in files, the `istio-ca-secret` or a
//! directory), the authenticator of the secure port (client certificates; tokens with
//! Kubernetes), the secure port's serving certificate, and the trust domain followed from the
//! mesh config.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::tasks::Tasks;
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
    /// Whether the snapshot stream between ingest and frontends is plaintext and anonymous
    /// (`--insecure-snapshot-stream`); by default it is mutual TLS from the CA.
    pub insecure_snapshot_stream: bool,
    /// The service accounts (of `namespace`, in the link trust domain) the snapshot server admits.
    pub snapshot_peers: Vec<String>,
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
            insecure_snapshot_stream: false,
            snapshot_peers: default_snapshot_peers(),
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

/// The process's CA, loaded once, on first need, and shared by everything that needs it: the
/// secure port, the snapshot stream's TLS, the validating webhook and the root publisher.
#[derive(Clone)]
pub struct SharedCa {
    settings: Arc<SecuritySettings>,
    kube: Option<kube::Client>,
    drain: DrainWatcher,
    loaded: Arc<tokio::sync::OnceCell<Arc<CertificateAuthority>>>,
}

impl SharedCa {
    /// A CA loaded as `settings` say (see [`load_ca`]) when first asked for.
    pub fn new(settings: &SecuritySettings, kube: Option<&kube::Client>, drain: &DrainWatcher) -> SharedCa {
        SharedCa {
            settings: Arc::new(settings.clone()),
            kube: kube.cloned(),
            drain: drain.clone(),
            loaded: Arc::default(),
        }
    }

    /// The CA, loaded now if no one asked for it before.
    pub async fn get(&self) -> Result<Arc<CertificateAuthority>, SecurityError> {
        let load = || load_ca(&self.settings, self.kube.as_ref(), &self.drain);
        self.loaded.get_or_try_init(load).await.cloned()
    }

    /// The CA, retrying every `retry` while it cannot be loaded (for work that must not stop the
    /// role, such as publishing its root); `None` once the drain started.
    async fn get_retrying(&self, retry: Duration) -> Option<Arc<CertificateAuthority>> {
        loop {
            match self.get().await {
                Ok(ca) => return Some(ca),
                Err(e) => warn!(error = %e, "the CA is not available; retrying"),
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = self.drain.draining() => return None,
            }
        }
    }

    /// The control plane's namespace the CA's names and secrets are in.
    pub fn namespace(&self) -> &str {
        &self.settings.namespace
    }
}

/// Starts the secure port's authenticator (with `kube`: tokens reviewed there) and serving
/// certificate from `ca`; the trust domain follows `snapshots`' mesh config.
pub async fn start(
    settings: &SecuritySettings,
    ca: Arc<CertificateAuthority>,
    kube: Option<kube::Client>,
    snapshots: SnapshotReader,
    registry: &Registry,
    tasks: &mut Tasks,
) -> Result<Security, SecurityError> {
    let trust_domain = SharedTrustDomain::new(TrustDomain::default());
    tasks.spawn("trust domain", follow_trust_domain(trust_domain.clone(), snapshots));
    let drain = tasks.drain();
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
    let mut waits: u32 = 0;
    let material = loop {
        let loaded = match (kube.is_none() && !settings.create_root, ca_files_missing(settings)) {
            (true, Some(missing)) => Err(missing),
            _ => ca::load_or_create(&source).await,
        };
        match loaded {
            Err(e @ CaError::NotCreatedYet(_)) => {
                // Loud at first and then now and again: a frontend pointed at the wrong files waits forever.
                if waits.is_multiple_of(15) {
                    warn!(reason = %e, "waiting for the CA's root (not ready until then)");
                }
                waits = waits.saturating_add(1);
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

/// Without Kubernetes, why a process that must not create a root (a frontend) has no CA yet: a
/// root of its own would be trusted by nobody, so it needs the ingest nodes' CA files.
fn ca_files_missing(settings: &SecuritySettings) -> Option<CaError> {
    let holds_ca = |dir: &std::path::Path| dir.join(ca::material::CA_CERT).exists();
    match holds_ca(&settings.plugin_dir) || holds_ca(&settings.root_dir) {
        true => None,
        false => Some(CaError::NotCreatedYet(format!(
            "no CA files in {} (--cacerts-dir) nor {} (--ca-dir): without Kubernetes a frontend needs the \
             ingest nodes' CA (the same --cacerts-dir, or the --ca-dir the ingest nodes keep their root in)",
            settings.plugin_dir.display(),
            settings.root_dir.display()
        ))),
    }
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

/// Keeps `trust_domain` at the mesh config's `trustDomain` of each new snapshot, until the
/// snapshots end.
async fn follow_trust_domain(trust_domain: SharedTrustDomain, mut snapshots: SnapshotReader) {
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
        next = snapshots.next().await;
    }
}

/// With Kubernetes, keeps the CA's root published in every namespace's `istio-ca-root-cert` while
/// `is_leader` holds (`None`: always, a standalone process). The CA is loaded in the task, with
/// retries: the CA's root must not stop snapshots.
pub fn keep_root_published(
    client: kube::Client,
    ca: SharedCa,
    is_leader: Option<tokio::sync::watch::Receiver<bool>>,
    tasks: &mut Tasks,
) {
    let drain = tasks.drain().clone();
    tasks.spawn_finishing("CA root publisher", async move {
        let Some(ca) = ca.get_retrying(Duration::from_secs(10)).await else { return };
        let root = ca.root_pem().to_string();
        let Some(is_leader) = is_leader else {
            root_publisher::run(client, root, async move { drain.draining().await }).await;
            return;
        };
        super::leadership::while_leading(is_leader, drain, |stop| {
            root_publisher::run(client.clone(), root.clone(), stop)
        })
        .await;
    });
}

pub use crate::security::link::{FRONTEND_SERVICE_ACCOUNT, INGEST_SERVICE_ACCOUNT};

/// The service accounts admitted on the snapshot stream by default: frontends and ingest nodes.
pub fn default_snapshot_peers() -> Vec<String> {
    vec![FRONTEND_SERVICE_ACCOUNT.to_string(), INGEST_SERVICE_ACCOUNT.to_string()]
}

/// Logs, once at start, that the snapshot stream runs without TLS (`--insecure-snapshot-stream`).
pub fn warn_insecure_snapshot_stream(role: &str) {
    warn!(
        role,
        "--insecure-snapshot-stream: the snapshot stream is plaintext and unauthenticated; anyone who reaches \
         the snapshot port reads every key, and a frontend follows whatever address etcd names"
    );
}

/// A frontend's credentials towards the leader, and the identity the leader must prove.
pub async fn frontend_link(
    ca: Arc<CertificateAuthority>,
    namespace: &str,
) -> Result<(Arc<LinkTls>, Identity), SecurityError> {
    let link = link_tls(ca, namespace, FRONTEND_SERVICE_ACCOUNT).await?;
    let leader = link.peer_identity(INGEST_SERVICE_ACCOUNT).map_err(|e| SecurityError::Link(e.to_string()))?;
    Ok((link, leader))
}

/// The snapshot server's mutual TLS on an ingest node advertising `advertise_addr`: a
/// certificate for its host carrying the ingest identity, and admission of the
/// `settings.snapshot_peers` service accounts of the control plane's namespace only.
pub async fn snapshot_server_tls(
    settings: &SecuritySettings,
    ca: &SharedCa,
    advertise_addr: &str,
) -> Result<(Arc<rustls::ServerConfig>, tls::PeerFilter), SecurityError> {
    let (ca, drain) = (ca.get().await?, &ca.drain);
    let link = link_tls(ca, &settings.namespace, INGEST_SERVICE_ACCOUNT).await?;
    let host = advertise_addr.rsplit_once(':').map_or(advertise_addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let w = drain.clone();
    let config = link
        .server_config(ServingNames::hosts(&[host]), async move { w.draining().await })
        .await
        .map_err(|e| SecurityError::Link(e.to_string()))?;
    info!(identity = %link.identity(), admitted = ?settings.snapshot_peers, "snapshot stream: mutual TLS");
    Ok((config, link.only_service_accounts(&settings.snapshot_peers)))
}
