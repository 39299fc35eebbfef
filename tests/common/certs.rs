//! Certificates the tests make themselves (rcgen): one mesh root per test process and a SPIFFE
//! leaf per workload, `spiffe://cluster.local/ns/NS/sa/SA`, as a CA would issue them. Sidecar
//! pods get theirs through Istio's mounted-certificate mode (see `sidecar`), so no CA runs.

use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

/// The mesh root: its PEM and the issuer that signs workload certificates.
pub struct MeshRoot {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A workload's certificate chain and key, PEM.
#[derive(Clone)]
pub struct Leaf {
    /// The certificate (the chain: leaf only, the root being trusted).
    pub cert: String,
    /// The private key.
    pub key: String,
}

impl MeshRoot {
    /// The process's mesh root, made on first use.
    pub fn get() -> &'static MeshRoot {
        static ROOT: OnceLock<MeshRoot> = OnceLock::new();
        ROOT.get_or_init(|| {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("root params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::OrganizationName, "cluster.local");
            params.distinguished_name.push(DnType::CommonName, "meshpilot test root");
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            let key = KeyPair::generate().expect("root key");
            MeshRoot { issuer: CertifiedIssuer::self_signed(params, key).expect("self-signed root") }
        })
    }

    /// The root certificate, PEM.
    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A workload certificate for `spiffe://cluster.local/ns/NAMESPACE/sa/ACCOUNT`.
    pub fn workload(&self, namespace: &str, account: &str) -> Leaf {
        let uri = format!("spiffe://cluster.local/ns/{namespace}/sa/{account}");
        self.leaf(vec![SanType::URI(uri.as_str().try_into().expect("an IA5 URI"))], true)
    }

    /// A server certificate for DNS names (a gateway's).
    pub fn server(&self, names: &[&str]) -> Leaf {
        let sans = names.iter().map(|n| SanType::DnsName((*n).try_into().expect("an IA5 name"))).collect();
        self.leaf(sans, false)
    }

    fn leaf(&self, sans: Vec<SanType>, client: bool) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("leaf params");
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        if client {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("signing a leaf");
        Leaf { cert: cert.pem(), key: key.serialize_pem() }
    }
}
