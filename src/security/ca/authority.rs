//! The certificate authority: signs workload certificates for SPIFFE identities, and the
//! serving and client certificates of meshpilot's own listeners and links, with the chain up to
//! the root attached as Istio returns it.

use std::net::IpAddr;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData, SanType, SerialNumber,
};
use ring::rand::SecureRandom;
use time::OffsetDateTime;

use super::material::CaMaterial;
use super::CaError;
use crate::security::identity::{Identity, TrustDomain};

/// Default lifetime of a workload certificate (Istio's `DEFAULT_WORKLOAD_CERT_TTL`).
pub const DEFAULT_WORKLOAD_TTL: Duration = Duration::from_secs(24 * 3600);
/// Default longest lifetime a workload may ask for (Istio's `MAX_WORKLOAD_CERT_TTL`).
pub const DEFAULT_MAX_WORKLOAD_TTL: Duration = Duration::from_secs(90 * 24 * 3600);
/// Lifetime of a self-signed root (Istio's `CITADEL_SELF_SIGNED_CA_CERT_TTL`: ten years).
pub const SELF_SIGNED_ROOT_TTL: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Certificates start this long before they are issued: clocks of peers drift.
const BACKDATE: Duration = Duration::from_secs(60);

/// Lifetimes of the certificates the CA issues.
#[derive(Debug, Clone, Copy)]
pub struct CaSettings {
    /// Lifetime of a workload certificate when the request names none.
    pub workload_ttl: Duration,
    /// The longest lifetime issued; longer requests are capped to it.
    pub max_workload_ttl: Duration,
}

impl Default for CaSettings {
    fn default() -> Self {
        CaSettings { workload_ttl: DEFAULT_WORKLOAD_TTL, max_workload_ttl: DEFAULT_MAX_WORKLOAD_TTL }
    }
}

/// A certificate with its private key, both PEM, and the chain above it.
#[derive(Clone)]
pub struct IssuedKeyPair {
    /// The certificate followed by the CA's chain (without the root).
    pub chain_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

/// A certificate authority over one signing certificate and key.
pub struct CertificateAuthority {
    signer: Issuer<'static, KeyPair>,
    material: CaMaterial,
    settings: CaSettings,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// A CA signing with `material` (checked: the key must belong to the signing certificate).
    pub fn new(material: CaMaterial, settings: CaSettings) -> Result<CertificateAuthority, CaError> {
        let key = KeyPair::from_pem(&material.ca_key).map_err(|e| CaError::Material(format!("ca-key.pem: {e}")))?;
        material.check_key_matches(&key.subject_public_key_info())?;
        let signer = Issuer::from_ca_cert_pem(&material.ca_cert, key)
            .map_err(|e| CaError::Material(format!("ca-cert.pem: {e}")))?;
        if settings.workload_ttl.is_zero() || settings.workload_ttl > settings.max_workload_ttl {
            return Err(CaError::Settings(format!(
                "the workload certificate TTL ({:?}) must be above zero and at most the maximum ({:?})",
                settings.workload_ttl, settings.max_workload_ttl
            )));
        }
        Ok(CertificateAuthority { signer, material, settings })
    }

    /// A new self-signed root for `trust_domain` (its key generated here: call off async workers).
    pub fn self_signed_material(trust_domain: &TrustDomain) -> Result<CaMaterial, CaError> {
        let key = KeyPair::generate().map_err(|e| CaError::Sign(e.to_string()))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        // Istio names its self-signed root's organisation after the trust domain.
        dn.push(DnType::OrganizationName, trust_domain.as_str());
        dn.push(DnType::CommonName, "meshpilot root CA");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + SELF_SIGNED_ROOT_TTL;
        params.serial_number = Some(random_serial()?);
        let cert = params.self_signed(&key).map_err(|e| CaError::Sign(e.to_string()))?;
        let pem = cert.pem();
        Ok(CaMaterial { ca_cert: pem.clone(), ca_key: key.serialize_pem(), cert_chain: String::new(), root_cert: pem })
    }

    /// The root certificate(s), PEM: what workloads trust (`root-cert.pem`).
    pub fn root_pem(&self) -> &str {
        &self.material.root_cert
    }

    /// The key material the CA signs with.
    pub fn material(&self) -> &CaMaterial {
        &self.material
    }

    /// The lifetimes it issues.
    pub fn settings(&self) -> CaSettings {
        self.settings
    }

    /// Signs `csr_pem` for a caller authenticated as `callers`, with the lifetime asked for (0:
    /// the default), capped by the maximum. Every SPIFFE id the CSR names must be one of the
    /// caller's own, else [`CaError::NotCallersIdentity`]; a CSR naming none gets the caller's
    /// first identity. Other SANs of the CSR are not issued. Returns the chain as Istio does:
    /// the certificate, `cert-chain.pem` when there is one, then the root. Signing is CPU work:
    /// call off async workers.
    pub fn sign_csr(&self, csr_pem: &str, callers: &[Identity], requested_ttl_secs: i64) -> Result<Vec<String>, CaError> {
        let first = callers.first().ok_or_else(|| CaError::NotCallersIdentity { asked: "any".into(), caller: "nobody".into() })?;
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| CaError::BadCsr(e.to_string()))?;
        let mut identities = Vec::new();
        for san in &csr.params.subject_alt_names {
            if let SanType::URI(uri) = san {
                let asked = Identity::parse(uri.as_str()).map_err(|e| CaError::BadCsr(e.to_string()))?;
                if !callers.contains(&asked) {
                    return Err(CaError::NotCallersIdentity { asked: asked.to_string(), caller: first.to_string() });
                }
                identities.push(asked);
            }
        }
        if identities.is_empty() {
            identities.push(first.clone());
        }
        let ttl = match u64::try_from(requested_ttl_secs) {
            Ok(0) | Err(_) => self.settings.workload_ttl,
            Ok(secs) => Duration::from_secs(secs).min(self.settings.max_workload_ttl),
        };
        let mut params = self.leaf_params(ttl)?;
        for identity in identities {
            let uri = identity.to_string().try_into().map_err(|e: rcgen::Error| CaError::Sign(e.to_string()))?;
            params.subject_alt_names.push(SanType::URI(uri));
        }
        let cert = params.signed_by(&csr.public_key, &self.signer).map_err(|e| CaError::Sign(e.to_string()))?;
        let mut chain = vec![cert.pem()];
        if !self.material.cert_chain.trim().is_empty() {
            chain.push(self.material.cert_chain.clone());
        }
        chain.push(self.material.root_cert.clone());
        Ok(chain)
    }

    /// A new key and certificate for `identity` (meshpilot's own links, tests): CPU work.
    pub fn issue_workload(&self, identity: &Identity, ttl: Duration) -> Result<IssuedKeyPair, CaError> {
        let uri = identity.to_string().try_into().map_err(|e: rcgen::Error| CaError::Sign(e.to_string()))?;
        self.issue(vec![SanType::URI(uri)], ttl.min(self.settings.max_workload_ttl))
    }

    /// A new key and serving certificate for `dns_names` and `ips` (the secure xDS port): CPU work.
    pub fn issue_serving(&self, dns_names: &[String], ips: &[IpAddr], ttl: Duration) -> Result<IssuedKeyPair, CaError> {
        let mut sans = Vec::new();
        for name in dns_names {
            let name = name.clone().try_into().map_err(|e: rcgen::Error| CaError::Settings(format!("SAN {name:?}: {e}")))?;
            sans.push(SanType::DnsName(name));
        }
        sans.extend(ips.iter().copied().map(SanType::IpAddress));
        self.issue(sans, ttl)
    }

    fn issue(&self, sans: Vec<SanType>, ttl: Duration) -> Result<IssuedKeyPair, CaError> {
        let key = KeyPair::generate().map_err(|e| CaError::Sign(e.to_string()))?;
        let mut params = self.leaf_params(ttl)?;
        params.subject_alt_names = sans;
        let cert = params.signed_by(&key, &self.signer).map_err(|e| CaError::Sign(e.to_string()))?;
        let mut chain_pem = cert.pem();
        if !self.material.cert_chain.trim().is_empty() {
            chain_pem.push_str(self.material.cert_chain.trim_end());
            chain_pem.push('\n');
        }
        Ok(IssuedKeyPair { chain_pem, key_pem: key.serialize_pem() })
    }

    /// A leaf for both TLS ends, valid from now (backdated a little) for `ttl`; no subject (the
    /// SANs are the identity, marked critical then, as Istio's are).
    fn leaf_params(&self, ttl: Duration) -> Result<CertificateParams, CaError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + ttl;
        params.serial_number = Some(random_serial()?);
        Ok(params)
    }
}

/// 16 random bytes, the top bit clear (a positive serial).
fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new().fill(&mut bytes).map_err(|_| CaError::Sign("no randomness for a serial number".into()))?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}
