//! Where the CA's key material comes from, in Istio's order: the plug-in `cacerts` directory
//! when it holds a CA, else the self-signed root kept in the `istio-ca-secret` Secret (with
//! Kubernetes) or in a directory (without), created on first start and reused after.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use tracing::info;

use super::authority::CertificateAuthority;
use super::material::{CaMaterial, CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT};
use super::CaError;
use crate::security::identity::TrustDomain;

/// The Secret istiod keeps its self-signed root in.
pub const CA_SECRET: &str = "istio-ca-secret";

/// Where a self-signed root is kept.
#[derive(Clone)]
pub enum RootStore {
    /// Files in a directory (standalone without Kubernetes).
    Directory(PathBuf),
    /// The `istio-ca-secret` Secret in the control plane's namespace.
    Secret {
        /// A client allowed to get (and, with `create`, create) the Secret there.
        client: kube::Client,
        /// The control plane's namespace.
        namespace: String,
        /// Whether this process creates the root when the Secret does not exist yet (standalone
        /// and ingest nodes); frontends only read it ([`CaError::NotCreatedYet`] until then).
        create: bool,
    },
}

impl std::fmt::Debug for RootStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RootStore::Directory(dir) => write!(f, "directory {}", dir.display()),
            RootStore::Secret { namespace, .. } => write!(f, "Secret {namespace}/{CA_SECRET}"),
        }
    }
}

/// Where the CA comes from.
#[derive(Debug, Clone)]
pub struct CaSource {
    /// Istio's plug-in CA directory (`ca-cert.pem`, `ca-key.pem`, `cert-chain.pem`,
    /// `root-cert.pem`); used when it holds `ca-cert.pem`.
    pub plugin_dir: PathBuf,
    /// Where a self-signed root is kept otherwise.
    pub root_store: RootStore,
    /// Names the self-signed root's organisation.
    pub trust_domain: TrustDomain,
}

/// Loads the CA's material: plug-in files, else the stored self-signed root, else a new one
/// (stored before it is used, so a restart reuses it).
pub async fn load_or_create(source: &CaSource) -> Result<CaMaterial, CaError> {
    if let Some(material) = CaMaterial::read_dir(&source.plugin_dir)? {
        info!(dir = %source.plugin_dir.display(), "CA: signing with the plug-in certificate (intermediate CA)");
        return Ok(material);
    }
    match &source.root_store {
        RootStore::Directory(dir) => {
            if let Some(material) = CaMaterial::read_dir(dir)? {
                info!(dir = %dir.display(), "CA: reusing the self-signed root");
                return Ok(material);
            }
            let material = generate(&source.trust_domain).await?;
            match claim_dir(dir, &material)? {
                true => {
                    info!(dir = %dir.display(), "CA: created a self-signed root");
                    Ok(material)
                }
                // Another process sharing the directory created its root first: everyone uses that one.
                false => CaMaterial::read_dir(dir)?
                    .ok_or_else(|| CaError::Io(format!("{}: a root appeared but cannot be read", dir.display()))),
            }
        }
        RootStore::Secret { client, namespace, create } => {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
            let kube_error = |e: kube::Error| CaError::Kubernetes(format!("Secret {namespace}/{CA_SECRET}: {e}"));
            if let Some(secret) = secrets.get_opt(CA_SECRET).await.map_err(kube_error)? {
                info!(%namespace, "CA: reusing the self-signed root of {CA_SECRET}");
                return from_secret(&secret);
            }
            if !create {
                return Err(CaError::NotCreatedYet(format!("Secret {namespace}/{CA_SECRET}")));
            }
            let material = generate(&source.trust_domain).await?;
            match secrets.create(&PostParams::default(), &to_secret(&material, namespace)).await {
                Ok(_) => {
                    info!(%namespace, "CA: created a self-signed root in {CA_SECRET}");
                    Ok(material)
                }
                // Another replica created it first: everyone uses that one.
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    let secret = secrets.get(CA_SECRET).await.map_err(kube_error)?;
                    from_secret(&secret)
                }
                Err(e) => Err(kube_error(e)),
            }
        }
    }
}

/// Writes `material` into `dir` only if no other process has put a root there first: written
/// aside, then renamed onto `dir` (which fails once `dir` holds files). `Ok(false)`: someone else won.
fn claim_dir(dir: &std::path::Path, material: &CaMaterial) -> Result<bool, CaError> {
    let io = |what: &std::path::Path, e: std::io::Error| CaError::Io(format!("{}: {e}", what.display()));
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "ca".into());
    // Unique per process and per attempt: tasks of one process may race too.
    static ATTEMPT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let attempt = ATTEMPT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let aside = parent.join(format!(".{name}.{}.{attempt}.tmp", std::process::id()));
    let _ = std::fs::remove_dir_all(&aside);
    material.write_dir(&aside)?;
    let claimed = std::fs::rename(&aside, dir).is_ok();
    if !claimed {
        let _ = std::fs::remove_dir_all(&aside);
    }
    match claimed || dir.join(super::material::CA_CERT).exists() {
        true => Ok(claimed),
        false => Err(CaError::Io(format!("{}: cannot create the CA's directory", dir.display()))),
    }
}

async fn generate(trust_domain: &TrustDomain) -> Result<CaMaterial, CaError> {
    let td = trust_domain.clone();
    tokio::task::spawn_blocking(move || CertificateAuthority::self_signed_material(&td))
        .await
        .map_err(|e| CaError::Sign(format!("generating the root: {e}")))?
}

/// The Secret istiod writes for its self-signed root (the same keys).
fn to_secret(material: &CaMaterial, namespace: &str) -> Secret {
    let data = [
        (CA_CERT, &material.ca_cert),
        (CA_KEY, &material.ca_key),
        (CERT_CHAIN, &material.cert_chain),
        (ROOT_CERT, &material.root_cert),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect::<BTreeMap<_, _>>();
    Secret {
        metadata: ObjectMeta { name: Some(CA_SECRET.into()), namespace: Some(namespace.into()), ..Default::default() },
        data: Some(data),
        type_: Some("istio.io/ca-root".into()),
        ..Default::default()
    }
}

fn from_secret(secret: &Secret) -> Result<CaMaterial, CaError> {
    let data = secret.data.clone().unwrap_or_default();
    let get = |key: &str, required: bool| -> Result<String, CaError> {
        match data.get(key) {
            Some(v) => String::from_utf8(v.0.clone())
                .map_err(|_| CaError::Material(format!("{CA_SECRET}: {key} is not PEM text"))),
            None if required => Err(CaError::Material(format!("{CA_SECRET} has no {key}"))),
            None => Ok(String::new()),
        }
    };
    let ca_cert = get(CA_CERT, true)?;
    let root_cert = match get(ROOT_CERT, false)? {
        // Older istiod Secrets hold only the self-signed certificate.
        r if r.trim().is_empty() => ca_cert.clone(),
        r => r,
    };
    Ok(CaMaterial { ca_key: get(CA_KEY, true)?, cert_chain: get(CERT_CHAIN, false)?, root_cert, ca_cert })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(dir: &std::path::Path) -> CaSource {
        CaSource {
            plugin_dir: dir.join("cacerts"),
            root_store: RootStore::Directory(dir.join("ca")),
            trust_domain: TrustDomain::default(),
        }
    }

    #[tokio::test]
    async fn a_restart_reuses_the_stored_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = load_or_create(&source(dir.path())).await.expect("created");
        let again = load_or_create(&source(dir.path())).await.expect("reloaded");
        assert!(first == again, "the same root after a restart");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("ca").join(CA_KEY)).expect("key file").permissions(),
        );
        assert_eq!(mode & 0o077, 0, "the key is private");
        // A half-written directory is an error, not a new root.
        std::fs::remove_file(dir.path().join("ca").join(CA_KEY)).expect("remove");
        assert!(load_or_create(&source(dir.path())).await.is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn processes_sharing_a_directory_agree_on_one_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let loads: Vec<_> = (0..4)
            .map(|_| {
                let source = source(dir.path());
                tokio::spawn(async move { load_or_create(&source).await.expect("loaded") })
            })
            .collect();
        let mut roots = Vec::new();
        for load in loads {
            roots.push(load.await.expect("joined").root_cert);
        }
        let stored = CaMaterial::read_dir(&dir.path().join("ca")).expect("read").expect("stored");
        assert!(roots.iter().all(|r| *r == stored.root_cert), "every loader uses the stored root");
    }

    #[tokio::test]
    async fn plugged_in_files_win_over_a_stored_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _ = load_or_create(&source(dir.path())).await.expect("created");
        let (plugged, _) = crate::security::ca::authority::tests::plugin_material();
        plugged.write_dir(&dir.path().join("cacerts")).expect("written");
        let loaded = load_or_create(&source(dir.path())).await.expect("loaded");
        assert!(loaded == plugged);
    }
}
