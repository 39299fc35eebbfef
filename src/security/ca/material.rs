//! A CA's key material in Istio's four files (`ca-cert.pem`, `ca-key.pem`, `cert-chain.pem`,
//! `root-cert.pem`): the layout of the plug-in `cacerts` directory and of the `istio-ca-secret`.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

use super::CaError;

/// The signing certificate.
pub const CA_CERT: &str = "ca-cert.pem";
/// The signing key.
pub const CA_KEY: &str = "ca-key.pem";
/// The chain from the signing certificate up to the root (empty for a self-signed root).
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// The root certificate(s) workloads trust.
pub const ROOT_CERT: &str = "root-cert.pem";

/// PEM contents of the four files.
#[derive(Clone, PartialEq, Eq)]
pub struct CaMaterial {
    /// `ca-cert.pem`.
    pub ca_cert: String,
    /// `ca-key.pem` (PKCS#8).
    pub ca_key: String,
    /// `cert-chain.pem` (may be empty).
    pub cert_chain: String,
    /// `root-cert.pem`.
    pub root_cert: String,
}

impl std::fmt::Debug for CaMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("CaMaterial")
            .field("ca_cert", &self.ca_cert)
            .field("root_cert", &self.root_cert)
            .finish_non_exhaustive()
    }
}

impl CaMaterial {
    /// Reads the files of `dir`; `Ok(None)` when it has no `ca-cert.pem` (nothing there yet),
    /// an error when it has one but not the others (a half-written CA is never used).
    pub fn read_dir(dir: &Path) -> Result<Option<CaMaterial>, CaError> {
        if !dir.join(CA_CERT).exists() {
            return Ok(None);
        }
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name))
                .map_err(|e| CaError::Io(format!("reading {}: {e}", dir.join(name).display())))
        };
        let cert_chain = match dir.join(CERT_CHAIN).exists() {
            true => read(CERT_CHAIN)?,
            false => String::new(),
        };
        Ok(Some(CaMaterial { ca_cert: read(CA_CERT)?, ca_key: read(CA_KEY)?, cert_chain, root_cert: read(ROOT_CERT)? }))
    }

    /// Writes the four files into `dir` (created), the key readable by the owner only.
    pub fn write_dir(&self, dir: &Path) -> Result<(), CaError> {
        let io = |what: &Path, e: std::io::Error| CaError::Io(format!("writing {}: {e}", what.display()));
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        for (name, text, mode) in [
            (CA_KEY, &self.ca_key, 0o600),
            (CERT_CHAIN, &self.cert_chain, 0o644),
            (ROOT_CERT, &self.root_cert, 0o644),
            // Last: its presence marks the directory complete (see `read_dir`).
            (CA_CERT, &self.ca_cert, 0o644),
        ] {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp"));
            write_with_mode(&tmp, text.as_bytes(), mode).map_err(|e| io(&tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }

    /// The root certificates, DER.
    pub fn roots(&self) -> Result<Vec<CertificateDer<'static>>, CaError> {
        parse_certs(&self.root_cert, ROOT_CERT)
    }

    /// Checks that `spki` (the key's SubjectPublicKeyInfo, DER) is the signing certificate's.
    pub fn check_key_matches(&self, spki: &[u8]) -> Result<(), CaError> {
        let certs = parse_certs(&self.ca_cert, CA_CERT)?;
        let first = certs.first().ok_or_else(|| CaError::Material(format!("{CA_CERT} holds no certificate")))?;
        let (_, cert) = x509_parser::parse_x509_certificate(first)
            .map_err(|e| CaError::Material(format!("{CA_CERT} does not parse: {e}")))?;
        if !cert.is_ca() {
            return Err(CaError::Material(format!("{CA_CERT} is not a CA certificate (basicConstraints CA:TRUE)")));
        }
        if cert.public_key().raw != spki {
            return Err(CaError::Material(format!("{CA_KEY} is not the key of {CA_CERT}")));
        }
        Ok(())
    }
}

/// Every certificate in `pem`; an error naming `what` when it holds none or one is broken.
pub fn parse_certs(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>, CaError> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CaError::Material(format!("{what}: {e}")))?;
    if certs.is_empty() {
        return Err(CaError::Material(format!("{what} holds no certificate")));
    }
    Ok(certs)
}

fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(mode).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}
