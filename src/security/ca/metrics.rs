//! The CA's metrics, with istiod's names (`citadel_server_*`), so its dashboards and alerts work.

use prometheus::{IntCounter, IntGauge};

use super::authority::CertificateAuthority;
use super::material::parse_certs;
use crate::telemetry::metrics::{counter, gauge, Registry};

/// Counters of `CreateCertificate`, and when the root expires.
#[derive(Clone, Debug)]
pub struct CaMetrics {
    /// `citadel_server_csr_count`: CSRs received.
    pub csr: IntCounter,
    /// `citadel_server_authentication_failure_count`: callers not authenticated, or asking for
    /// an identity not theirs.
    pub authentication_failure: IntCounter,
    /// `citadel_server_csr_parsing_err_count`: CSRs that do not parse or verify.
    pub csr_parsing_error: IntCounter,
    /// `citadel_server_csr_sign_err_count`: signing failures.
    pub csr_sign_error: IntCounter,
    /// `citadel_server_success_cert_issuance_count`: certificates issued.
    pub success: IntCounter,
    /// `citadel_server_root_cert_expiry_timestamp`: when the root expires (Unix seconds).
    pub root_cert_expiry_timestamp: IntGauge,
}

impl CaMetrics {
    /// Registers them in `r`.
    pub fn register(r: &Registry) -> CaMetrics {
        CaMetrics {
            csr: counter(r, "citadel_server_csr_count", "The number of CSRs received by the CA."),
            authentication_failure: counter(
                r,
                "citadel_server_authentication_failure_count",
                "The number of authentication failures (including CSRs for another identity).",
            ),
            csr_parsing_error: counter(
                r,
                "citadel_server_csr_parsing_err_count",
                "The number of errors occurred when parsing the CSR.",
            ),
            csr_sign_error: counter(
                r,
                "citadel_server_csr_sign_err_count",
                "The number of errors occurred when signing the CSR.",
            ),
            success: counter(
                r,
                "citadel_server_success_cert_issuance_count",
                "The number of certificates issuances that have succeeded.",
            ),
            root_cert_expiry_timestamp: gauge(
                r,
                "citadel_server_root_cert_expiry_timestamp",
                "The unix timestamp, in seconds, when the root cert will expire.",
            ),
        }
    }

    /// Records when `ca`'s (first) root expires.
    pub fn set_root_expiry(&self, ca: &CertificateAuthority) {
        let Ok(roots) = parse_certs(ca.root_pem(), "root") else { return };
        let expiry = roots
            .first()
            .and_then(|der| x509_parser::parse_x509_certificate(der).ok())
            .map(|(_, cert)| cert.validity().not_after.timestamp());
        if let Some(expiry) = expiry {
            self.root_cert_expiry_timestamp.set(expiry);
        }
    }
}
