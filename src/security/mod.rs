//! Security: meshpilot's CA (Istio's certificate API), workload identities, and the
//! authentication of callers of the secure port (client certificates from the CA, Kubernetes
//! service-account tokens), with the TLS that carries them.
//!
//! - [`identity`]: SPIFFE ids and the trust domain.
//! - [`ca`]: key material, signing, the `CreateCertificate` service, the root ConfigMaps.
//! - [`authn`]: who a caller is.
//! - [`tls`]: server and client TLS configurations, and peer identities per connection.
//! - [`handshake`]: how long and how many connections may take before their TLS session.
//! - [`serving`]: the secure port's own certificate, renewed from the CA.
//! - [`link`]: mutual TLS between meshpilot's own processes (the snapshot stream).

pub mod authn;
pub mod ca;
pub mod handshake;
pub mod identity;
pub mod link;
pub mod serving;
pub mod tls;

pub use authn::{AuthError, Authenticator, TokenReviewer};
pub use identity::{Identity, SharedTrustDomain, TrustDomain};
