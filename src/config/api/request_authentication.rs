//! `RequestAuthentication` (security.istio.io v1, v1beta1): which JWTs a workload accepts.

use serde::{Deserialize, Serialize};

use super::authorization_policy::PolicyTargetReference;
use super::common::{Duration, WorkloadSelector};

/// The `spec` of a RequestAuthentication.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct RequestAuthentication {
    /// Workloads it applies to; none means its namespace (or the mesh, in the root namespace).
    pub selector: Option<WorkloadSelector>,
    /// Gateway API / Service target (not served by meshpilot; rejected by validation).
    pub target_ref: Option<PolicyTargetReference>,
    /// Gateway API / Service targets (not served by meshpilot; rejected by validation).
    pub target_refs: Vec<PolicyTargetReference>,
    /// Accepted token issuers.
    pub jwt_rules: Vec<JwtRule>,
}

/// One accepted issuer and how its tokens are found and checked.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JwtRule {
    /// The `iss` tokens must carry.
    pub issuer: String,
    /// Accepted `aud` values (any; none accepts every audience).
    pub audiences: Vec<String>,
    /// Where Envoy fetches the public keys.
    pub jwks_uri: String,
    /// The public keys, inline (JWKS JSON).
    pub jwks: String,
    /// Headers the token may come in.
    pub from_headers: Vec<JwtHeader>,
    /// Query parameters the token may come in.
    pub from_params: Vec<String>,
    /// Cookies the token may come in.
    pub from_cookies: Vec<String>,
    /// Header the verified payload is forwarded in (base64url).
    pub output_payload_to_header: String,
    /// Keep the token in the forwarded request.
    pub forward_original_token: bool,
    /// Claims copied into request headers.
    pub output_claim_to_headers: Vec<ClaimToHeader>,
    /// Timeout of the JWKS fetch.
    pub timeout: Option<Duration>,
}

/// A header a token may come in, with its value prefix (e.g. `Bearer `).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct JwtHeader {
    /// Header name.
    pub name: String,
    /// Prefix before the token.
    pub prefix: String,
}

/// A claim copied into a header.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ClaimToHeader {
    /// Header name.
    pub header: String,
    /// Claim name.
    pub claim: String,
}
