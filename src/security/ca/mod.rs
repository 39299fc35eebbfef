//! meshpilot's certificate authority: its key material (plug-in files, the `istio-ca-secret`,
//! or a directory), the signing of workload certificates, and Istio's certificate service.

pub mod authority;
pub mod material;
pub mod metrics;
pub mod root_publisher;
pub mod service;
pub mod store;

pub use authority::{CaSettings, CertificateAuthority, IssuedKeyPair};
pub use material::CaMaterial;
pub use store::{load_or_create, CaSource, RootStore, CA_SECRET};

/// Why the CA could not start or sign.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CaError {
    /// The key material is unusable.
    #[error("CA key material: {0}")]
    Material(String),
    /// A lifetime setting is out of range.
    #[error("CA settings: {0}")]
    Settings(String),
    /// Files could not be read or written.
    #[error("CA files: {0}")]
    Io(String),
    /// The Kubernetes Secret could not be read or written.
    #[error("CA Secret: {0}")]
    Kubernetes(String),
    /// The CSR does not parse, its signature is wrong, or a SAN is not a SPIFFE id.
    #[error("bad certificate signing request: {0}")]
    BadCsr(String),
    /// The CSR asks for an identity that is not the caller's.
    #[error("the CSR asks for {asked}, but the caller is {caller}")]
    NotCallersIdentity {
        /// The identity asked for.
        asked: String,
        /// The caller's.
        caller: String,
    },
    /// The stored root does not exist yet and this process does not create it.
    #[error("{0} does not exist yet (the ingest leader creates it)")]
    NotCreatedYet(String),
    /// Signing failed.
    #[error("signing: {0}")]
    Sign(String),
}
