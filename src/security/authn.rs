//! Who is calling: a client certificate from meshpilot's CA (verified in the TLS handshake), or
//! a Kubernetes service-account token (`authorization: Bearer`), validated with a TokenReview
//! against the API server for the audience `istio-ca`, as istiod does.

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::Api;
use tonic::Status;

use super::identity::{Identity, SharedTrustDomain};
use super::tls::PeerInfo;

/// The audience pilot-agent's token is minted for, and istiod checks.
pub const TOKEN_AUDIENCE: &str = "istio-ca";
/// Longest token accepted (Kubernetes tokens are a kilobyte or two).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a caller is not authenticated.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    /// Neither a client certificate nor a token.
    #[error(
        "no credentials: present a client certificate from meshpilot's CA or a Kubernetes service-account token \
         (authorization: Bearer) for the audience {TOKEN_AUDIENCE}"
    )]
    Missing,
    /// A token, but no API server to check it with.
    #[error(
        "token authentication is not available: this meshpilot runs without Kubernetes, so it cannot validate \
         service-account tokens (TokenReview); authenticate with a client certificate from meshpilot's CA"
    )]
    NoTokenReview,
    /// The API server refused the token, or it names no service account.
    #[error("token refused: {0}")]
    TokenRefused(String),
    /// The API server could not be asked.
    #[error("token review failed: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// The gRPC status a caller gets.
    pub fn status(&self) -> Status {
        match self {
            AuthError::Unavailable(_) => Status::unavailable(self.to_string()),
            _ => Status::unauthenticated(self.to_string()),
        }
    }
}

/// TokenReviews in flight at once: a storm of reconnecting proxies (or of bogus tokens) queues
/// here instead of flooding the API server.
const MAX_CONCURRENT_REVIEWS: usize = 32;
/// A review the API server has not answered by then fails (UNAVAILABLE: the proxy retries).
const REVIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Validates service-account tokens with TokenReviews.
#[derive(Clone)]
pub struct TokenReviewer {
    client: kube::Client,
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl TokenReviewer {
    /// Reviews with `client` (it needs `create` on `tokenreviews`).
    pub fn new(client: kube::Client) -> TokenReviewer {
        TokenReviewer { client, in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_REVIEWS)) }
    }

    /// The namespace and service account the API server says `token` belongs to.
    pub async fn review(&self, token: &str) -> Result<(String, String), AuthError> {
        let reviewed = async {
            let _slot = self.in_flight.acquire().await.map_err(|_| AuthError::Unavailable("shutting down".into()))?;
            self.review_now(token).await
        };
        tokio::time::timeout(REVIEW_TIMEOUT, reviewed)
            .await
            .map_err(|_| AuthError::Unavailable(format!("no TokenReview answer within {REVIEW_TIMEOUT:?}")))?
    }

    async fn review_now(&self, token: &str) -> Result<(String, String), AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), audiences: Some(vec![TOKEN_AUDIENCE.into()]) },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| AuthError::Unavailable(format!("TokenReview: {e}")))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(AuthError::TokenRefused(status.error.unwrap_or_else(|| "not authenticated".into())));
        }
        // The API server answers with the audiences the token is valid for among those asked.
        if let Some(audiences) = &status.audiences {
            if !audiences.iter().any(|a| a == TOKEN_AUDIENCE) {
                return Err(AuthError::TokenRefused(format!("the token is not for the audience {TOKEN_AUDIENCE}")));
            }
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        service_account_of(&username)
            .ok_or_else(|| AuthError::TokenRefused(format!("{username:?} is not a service account")))
    }
}

/// `system:serviceaccount:NS:SA` → (NS, SA).
fn service_account_of(username: &str) -> Option<(String, String)> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, sa) = rest.split_once(':')?;
    (!ns.is_empty() && !sa.is_empty() && !sa.contains(':')).then(|| (ns.to_string(), sa.to_string()))
}

/// Authenticates callers of the secure port.
#[derive(Clone)]
pub struct Authenticator {
    tokens: Option<TokenReviewer>,
    trust_domain: SharedTrustDomain,
}

impl Authenticator {
    /// Client certificates always; tokens when `tokens` is given (with Kubernetes).
    pub fn new(tokens: Option<TokenReviewer>, trust_domain: SharedTrustDomain) -> Arc<Authenticator> {
        Arc::new(Authenticator { tokens, trust_domain })
    }

    /// The caller's identities: its client certificate's, else its token's.
    pub async fn authenticate(
        &self,
        peer: Option<&PeerInfo>,
        headers: &http::HeaderMap,
    ) -> Result<Vec<Identity>, AuthError> {
        if let Some(peer) = peer.filter(|p| !p.identities.is_empty()) {
            return Ok(peer.identities.as_ref().clone());
        }
        let Some(token) = bearer_token(headers)? else { return Err(AuthError::Missing) };
        let reviewer = self.tokens.as_ref().ok_or(AuthError::NoTokenReview)?;
        let (namespace, service_account) = reviewer.review(token).await?;
        let identity = Identity::new(self.trust_domain.get(), &namespace, &service_account)
            .map_err(|e| AuthError::TokenRefused(e.to_string()))?;
        Ok(vec![identity])
    }
}

/// The token of an `authorization: Bearer TOKEN` header; an error for any other authorization.
fn bearer_token(headers: &http::HeaderMap) -> Result<Option<&str>, AuthError> {
    let Some(value) = headers.get(http::header::AUTHORIZATION) else { return Ok(None) };
    let refused = |why: &str| AuthError::TokenRefused(why.to_string());
    let text = value.to_str().map_err(|_| refused("the authorization header is not text"))?;
    let (scheme, token) =
        text.split_once(' ').ok_or_else(|| refused("the authorization header is not `Bearer TOKEN`"))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(refused("the authorization header is not `Bearer TOKEN`"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(refused("the token is too long"));
    }
    Ok(Some(token.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::identity::TrustDomain;

    #[test]
    fn service_account_usernames_are_parsed_and_others_refused() {
        assert_eq!(service_account_of("system:serviceaccount:ns-a:reviews"), Some(("ns-a".into(), "reviews".into())));
        assert_eq!(service_account_of("admin"), None);
        assert_eq!(service_account_of("system:serviceaccount:ns-a"), None);
        assert_eq!(service_account_of("system:serviceaccount::sa"), None);
    }

    #[tokio::test]
    async fn without_kubernetes_a_token_caller_is_told_to_use_a_certificate() {
        let authn = Authenticator::new(None, SharedTrustDomain::new(TrustDomain::default()));
        let mut headers = http::HeaderMap::new();
        assert!(matches!(authn.authenticate(None, &headers).await, Err(AuthError::Missing)));
        headers.insert(http::header::AUTHORIZATION, http::HeaderValue::from_static("Bearer abc"));
        let err = authn.authenticate(None, &headers).await.expect_err("refused");
        assert!(matches!(err, AuthError::NoTokenReview));
        assert_eq!(err.status().code(), tonic::Code::Unauthenticated);
        assert!(err.to_string().contains("client certificate"), "{err}");
        let peer = PeerInfo {
            remote: None,
            identities: Arc::new(vec![Identity::parse("spiffe://cluster.local/ns/a/sa/b").expect("id")]),
        };
        assert_eq!(authn.authenticate(Some(&peer), &headers).await.expect("cert").len(), 1);
    }
}
