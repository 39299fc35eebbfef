//! `istio.v1.auth.IstioCertificateService/CreateCertificate`: a caller authenticated by its
//! client certificate or service-account token gets a certificate for its own identity.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tracing::{info, warn};

use super::authority::CertificateAuthority;
use super::metrics::CaMetrics;
use super::CaError;
use crate::security::authn::Authenticator;
use crate::security::tls::PeerInfo;
use crate::telemetry::log_text::Untrusted;

/// Istio's CA API, generated from `proto/istio/v1/auth/ca.proto`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("istio.v1.auth");
}

use pb::istio_certificate_service_server::{IstioCertificateService, IstioCertificateServiceServer};
use pb::{IstioCertificateRequest, IstioCertificateResponse};

/// Largest CSR accepted (a 4096-bit RSA CSR is under 2 KB).
const MAX_CSR_BYTES: usize = 64 * 1024;

/// The CA's gRPC service.
#[derive(Clone)]
pub struct CaService {
    ca: Arc<CertificateAuthority>,
    authn: Arc<Authenticator>,
    metrics: CaMetrics,
}

impl CaService {
    /// Signs with `ca` for callers `authn` authenticates, counting in `metrics`.
    pub fn new(ca: Arc<CertificateAuthority>, authn: Arc<Authenticator>, metrics: CaMetrics) -> CaService {
        metrics.set_root_expiry(&ca);
        CaService { ca, authn, metrics }
    }

    /// The tonic service.
    pub fn into_service(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self)
    }
}

/// The status a CA error gives the caller.
fn status_of(error: &CaError) -> Status {
    match error {
        CaError::NotCallersIdentity { .. } => Status::permission_denied(error.to_string()),
        CaError::BadCsr(_) => Status::invalid_argument(error.to_string()),
        _ => Status::internal("the CA could not sign the request"),
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.csr.inc();
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let headers = request.metadata().clone().into_headers();
        let callers = self.authn.authenticate(peer.as_ref(), &headers).await.map_err(|e| {
            warn!(remote = ?peer.as_ref().and_then(|p| p.remote), error = %Untrusted(&e.to_string()), "CA request not authenticated");
            self.metrics.authentication_failure.inc();
            e.status()
        })?;
        let req = request.into_inner();
        // Istio lets only trusted node agents sign for others; meshpilot lets nobody.
        if req.metadata.as_ref().is_some_and(|m| m.fields.contains_key("ImpersonatedIdentity")) {
            return Err(Status::permission_denied("impersonating another identity is not allowed"));
        }
        if req.csr.len() > MAX_CSR_BYTES {
            return Err(Status::invalid_argument(format!("the CSR is larger than {MAX_CSR_BYTES} bytes")));
        }
        let ca = self.ca.clone();
        let ttl = req.validity_duration;
        let for_log = callers.first().map(ToString::to_string).unwrap_or_default();
        let signed = tokio::task::spawn_blocking(move || ca.sign_csr(&req.csr, &callers, ttl))
            .await
            .map_err(|_| Status::internal("the CA could not sign the request"))?;
        match signed {
            Ok(cert_chain) => {
                self.metrics.success.inc();
                info!(identity = %Untrusted(&for_log), "CA: certificate issued");
                Ok(Response::new(IstioCertificateResponse { cert_chain }))
            }
            Err(e) => {
                match &e {
                    CaError::NotCallersIdentity { .. } => self.metrics.authentication_failure.inc(),
                    CaError::BadCsr(_) => self.metrics.csr_parsing_error.inc(),
                    _ => self.metrics.csr_sign_error.inc(),
                }
                warn!(caller = %Untrusted(&for_log), error = %Untrusted(&e.to_string()), "CA: request refused");
                Err(status_of(&e))
            }
        }
    }
}
