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
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
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
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        callers: &[Identity],
        requested_ttl_secs: i64,
    ) -> Result<Vec<String>, CaError> {
        let first = callers
            .first()
            .ok_or_else(|| CaError::NotCallersIdentity { asked: "any".into(), caller: "nobody".into() })?;
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
        self.issue_serving_as(dns_names, ips, &[], ttl)
    }

    /// As [`Self::issue_serving`], the certificate also carrying `identities` (URI SANs): a
    /// control-plane server proving its role to the clients of a link: CPU work.
    pub fn issue_serving_as(
        &self,
        dns_names: &[String],
        ips: &[IpAddr],
        identities: &[Identity],
        ttl: Duration,
    ) -> Result<IssuedKeyPair, CaError> {
        let mut sans = Vec::new();
        for identity in identities {
            let uri = identity.to_string().try_into().map_err(|e: rcgen::Error| CaError::Sign(e.to_string()))?;
            sans.push(SanType::URI(uri));
        }
        for name in dns_names {
            let name =
                name.clone().try_into().map_err(|e: rcgen::Error| CaError::Settings(format!("SAN {name:?}: {e}")))?;
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
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| CaError::Sign("no randomness for a serial number".into()))?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

#[cfg(test)]
pub(crate) mod tests {
    use rustls::pki_types::UnixTime;

    use super::*;
    use crate::security::ca::material::parse_certs;
    use crate::security::tls::certificate_identities;

    fn td() -> TrustDomain {
        TrustDomain::new("cluster.local").expect("trust domain")
    }

    fn id(ns: &str, sa: &str) -> Identity {
        Identity::new(td(), ns, sa).expect("identity")
    }

    fn root_ca(settings: CaSettings) -> CertificateAuthority {
        CertificateAuthority::new(CertificateAuthority::self_signed_material(&td()).expect("root"), settings)
            .expect("CA")
    }

    /// A CSR (PEM) for `sans` (URIs), and its key.
    fn csr(sans: &[&str]) -> (String, KeyPair) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::default();
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names =
            sans.iter().map(|s| SanType::URI((*s).to_string().try_into().expect("ia5"))).collect();
        let pem = params.serialize_request(&key).expect("csr").pem().expect("pem");
        (pem, key)
    }

    /// Verifies `chain` (each entry may hold several PEM certificates) up to `roots_pem`, as a TLS
    /// server would a client's.
    fn verify(chain: &[String], roots_pem: &str) -> Result<(), rustls::Error> {
        let certs: Vec<_> = chain.iter().flat_map(|c| parse_certs(c, "chain").expect("certs")).collect();
        let mut store = rustls::RootCertStore::empty();
        for root in parse_certs(roots_pem, "roots").expect("roots") {
            store.add(root).expect("root");
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(store),
            crate::security::tls::provider(),
        )
        .build()
        .expect("verifier");
        verifier.verify_client_cert(&certs[0], &certs[1..], UnixTime::now()).map(|_| ())
    }

    fn validity(pem: &str) -> Duration {
        let der = parse_certs(pem, "leaf").expect("leaf").remove(0);
        let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("parses");
        let v = cert.validity();
        Duration::from_secs(u64::try_from(v.not_after.timestamp() - v.not_before.timestamp()).expect("positive"))
    }

    use std::sync::Arc;

    #[test]
    fn a_workload_gets_its_spiffe_id_for_the_ttl_with_a_chain_to_the_root() {
        let ca = root_ca(CaSettings {
            workload_ttl: Duration::from_secs(3600),
            max_workload_ttl: Duration::from_secs(7200),
        });
        let me = id("ns-a", "reviews");
        let (pem, _) = csr(&["spiffe://cluster.local/ns/ns-a/sa/reviews"]);
        let chain = ca.sign_csr(&pem, std::slice::from_ref(&me), 0).expect("signed");
        assert_eq!(chain.len(), 2, "certificate and root");
        assert_eq!(chain[1], ca.root_pem());
        let leaf = parse_certs(&chain[0], "leaf").expect("leaf").remove(0);
        assert_eq!(certificate_identities(&leaf), vec![me.clone()]);
        assert_eq!(validity(&chain[0]), Duration::from_secs(3600) + BACKDATE);
        verify(&chain, ca.root_pem()).expect("the chain verifies to the root");
        // A longer request is capped at the maximum; a shorter one is honoured.
        let capped = ca.sign_csr(&pem, std::slice::from_ref(&me), 1_000_000).expect("signed");
        assert_eq!(validity(&capped[0]), Duration::from_secs(7200) + BACKDATE);
        let short = ca.sign_csr(&pem, std::slice::from_ref(&me), 600).expect("signed");
        assert_eq!(validity(&short[0]), Duration::from_secs(600) + BACKDATE);
        // Another CA's root does not verify it.
        let other = root_ca(CaSettings::default());
        assert!(verify(&chain, other.root_pem()).is_err());
    }

    #[test]
    fn a_csr_for_another_identity_is_refused() {
        let ca = root_ca(CaSettings::default());
        let (pem, _) = csr(&["spiffe://cluster.local/ns/ns-b/sa/reviews"]);
        let err = ca.sign_csr(&pem, &[id("ns-a", "reviews")], 0).expect_err("refused");
        assert!(matches!(err, CaError::NotCallersIdentity { .. }), "{err}");
        let (pem, _) = csr(&["spiffe://cluster.local/ns/ns-a/sa/ratings"]);
        assert!(matches!(ca.sign_csr(&pem, &[id("ns-a", "reviews")], 0), Err(CaError::NotCallersIdentity { .. })));
        assert!(matches!(ca.sign_csr("garbage", &[id("ns-a", "reviews")], 0), Err(CaError::BadCsr(_))));
        // A CSR naming no identity gets the caller's.
        let (pem, _) = csr(&[]);
        let chain = ca.sign_csr(&pem, &[id("ns-a", "reviews")], 0).expect("signed");
        let leaf = parse_certs(&chain[0], "leaf").expect("leaf").remove(0);
        assert_eq!(certificate_identities(&leaf), vec![id("ns-a", "reviews")]);
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused() {
        let a = CertificateAuthority::self_signed_material(&td()).expect("a");
        let b = CertificateAuthority::self_signed_material(&td()).expect("b");
        let mixed = CaMaterial { ca_key: b.ca_key, ..a };
        assert!(matches!(CertificateAuthority::new(mixed, CaSettings::default()), Err(CaError::Material(_))));
    }

    /// Istio's plug-in layout: a root, an intermediate signing, `cert-chain.pem` = intermediate + root.
    pub(crate) fn plugin_material() -> (CaMaterial, String) {
        let root_key = KeyPair::generate().expect("key");
        let mut root_params = CertificateParams::default();
        root_params.distinguished_name.push(DnType::CommonName, "Root CA");
        root_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        root_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let root_cert = root_params.self_signed(&root_key).expect("root");
        let root_issuer = Issuer::new(root_params, root_key);
        let int_key = KeyPair::generate().expect("key");
        let mut int_params = CertificateParams::default();
        int_params.distinguished_name = DistinguishedName::new();
        int_params.distinguished_name.push(DnType::CommonName, "Intermediate CA");
        int_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        int_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let int_cert = int_params.signed_by(&int_key, &root_issuer).expect("intermediate");
        let material = CaMaterial {
            ca_cert: int_cert.pem(),
            ca_key: int_key.serialize_pem(),
            cert_chain: format!("{}{}", int_cert.pem(), root_cert.pem()),
            root_cert: root_cert.pem(),
        };
        (material, int_cert.pem())
    }

    #[test]
    fn a_plugged_in_intermediate_signs_and_returns_the_chain_as_istio_does() {
        let (material, intermediate) = plugin_material();
        let ca = CertificateAuthority::new(material.clone(), CaSettings::default()).expect("CA");
        let (pem, _) = csr(&["spiffe://cluster.local/ns/ns-a/sa/reviews"]);
        let chain = ca.sign_csr(&pem, &[id("ns-a", "reviews")], 0).expect("signed");
        assert_eq!(chain.len(), 3, "certificate, cert-chain.pem, root-cert.pem");
        assert_eq!(chain[1], material.cert_chain);
        assert!(chain[1].starts_with(&intermediate));
        assert_eq!(chain[2], material.root_cert);
        verify(&chain, &material.root_cert).expect("verifies through the intermediate to the plugged root");
        // The intermediate's own root alone is not enough without the intermediate.
        assert!(verify(&chain[..1], &material.root_cert).is_err());
        // Serving certificates carry the intermediate too.
        let served =
            ca.issue_serving(&["istiod.istio-system.svc".into()], &[], Duration::from_secs(60)).expect("issued");
        assert_eq!(parse_certs(&served.chain_pem, "served").expect("certs").len(), 3);
    }
}
