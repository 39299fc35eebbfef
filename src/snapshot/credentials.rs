//! Gateway credentials: the Kubernetes Secrets Gateway servers (and DestinationRules, for egress
//! gateways) name in `credentialName`. As in
//! Istio, a gateway proxy reads the Secret from its own namespace (the gateway deployment's, not
//! necessarily the Gateway resource's). Only Secrets some Gateway names enter a snapshot (and so
//! travel to frontends); a server whose Secret is missing or incomplete where the proxy runs is
//! not served, and a name no namespace holds is reported.

use std::collections::BTreeSet;

use crate::config::api::gateway::ServerTlsSettings;
use crate::config::error::FieldError;
use crate::config::{ConfigError, ConfigKey, Spec, ValidConfig};
use crate::registry::kubernetes::{KubeKey, KubeKind, KubeObject, KubeObjects};

/// The scheme Istio gives Kubernetes Secret credentials.
const KUBERNETES_SCHEME: &str = "kubernetes://";
/// The suffix of the Secret holding a credential's CA when its own has none.
pub const CA_SECRET_SUFFIX: &str = "-cacert";
/// The `file` errors about credentials are reported under.
const SOURCE: &str = "gateway credentials";

/// The Secret name a `credentialName` refers to; `None` for other schemes.
pub fn secret_name(credential: &str) -> Option<&str> {
    match credential.split_once("://") {
        None => Some(credential),
        Some(_) => credential.strip_prefix(KUBERNETES_SCHEME),
    }
}

fn servers(config: &ValidConfig) -> impl Iterator<Item = (usize, &ServerTlsSettings)> {
    let servers = match &config.spec {
        Spec::Gateway(g) => g.servers.as_slice(),
        _ => &[],
    };
    servers.iter().enumerate().filter_map(|(i, s)| s.tls.as_ref().map(|t| (i, t)))
}

pub(super) fn secret_key(namespace: &str, name: &str) -> KubeKey {
    KubeKey { kind: KubeKind::Secret, namespace: namespace.to_string(), name: name.to_string() }
}

/// The `credentialName`s of a DestinationRule's client TLS (egress gateways originate TLS with
/// them): the rule's, its ports' and its subsets'.
fn client_credentials(config: &ValidConfig) -> Vec<&str> {
    let Spec::DestinationRule(dr) = &config.spec else { return Vec::new() };
    let policies = dr.traffic_policy.iter().chain(dr.subsets.iter().filter_map(|s| s.traffic_policy.as_ref()));
    policies
        .flat_map(|p| p.tls.iter().chain(p.port_level_settings.iter().filter_map(|pl| pl.tls.as_ref())))
        .map(|t| t.credential_name.as_str())
        .collect()
}

/// The Secrets a Gateway's servers or a DestinationRule's client TLS name as credentials, with
/// their `-cacert` companions.
pub(super) fn named_secrets(config: &ValidConfig) -> Vec<String> {
    let servers = servers(config).map(|(_, tls)| tls.credential_name.as_str());
    let names = servers.chain(client_credentials(config)).filter_map(|c| secret_name(c).filter(|n| !n.is_empty()));
    names.flat_map(|name| [name.to_string(), format!("{name}{CA_SECRET_SUFFIX}")]).collect()
}

/// `kube` without the Secrets not in `wanted` (the names [`named_secrets`] gives).
pub(super) fn keep_referenced(kube: &KubeObjects, wanted: &BTreeSet<&str>) -> KubeObjects {
    let first = secret_key("", "");
    let unwanted: Vec<KubeKey> = kube
        .range(first..)
        .take_while(|(k, _)| k.kind == KubeKind::Secret)
        .filter(|(k, _)| !wanted.contains(k.name.as_str()))
        .map(|(k, _)| k.clone())
        .collect();
    if unwanted.is_empty() {
        return kube.clone();
    }
    let mut kept = kube.clone();
    for key in unwanted {
        kept.remove(&key);
    }
    kept
}

/// Why a server's credential cannot be served; `None` when it can.
pub(super) fn credential_problem(
    snapshot_kube: &KubeObjects,
    namespace: &str,
    tls: &ServerTlsSettings,
) -> Option<String> {
    let Some(name) = secret_name(&tls.credential_name) else {
        return Some(format!("{:?}: only kubernetes:// credentials are served", tls.credential_name));
    };
    let secret = |n: &str| match snapshot_kube.get(&secret_key(namespace, n)).map(|o| &**o) {
        Some(KubeObject::Secret(s)) => Some(s),
        _ => None,
    };
    let Some(s) = secret(name) else {
        return Some(format!(
            "Secret {name} not found in {namespace:?} (credentials are Kubernetes Secrets in the gateway's namespace; the file source has none): server not served"
        ));
    };
    if s.cert_chain.is_empty() || s.private_key.is_empty() {
        return Some(format!("Secret {namespace}/{name} has no tls.crt/tls.key (or cert/key): server not served"));
    }
    let mutual = matches!(tls.mode.as_deref(), Some("MUTUAL" | "OPTIONAL_MUTUAL"));
    let ca = !s.ca.is_empty() || secret(&format!("{name}{CA_SECRET_SUFFIX}")).is_some_and(|c| !c.ca.is_empty());
    if mutual && !ca {
        return Some(format!(
            "Secret {namespace}/{name} has no ca.crt and there is no {name}{CA_SECRET_SUFFIX} with one: server not served"
        ));
    }
    None
}

/// Errors for Gateway servers whose credential no namespace can serve: the problem with the
/// first Secret of that name, or that none exists.
pub(super) fn credential_errors<'a>(
    kube: &KubeObjects,
    configs: impl Iterator<Item = &'a ValidConfig>,
) -> Vec<ConfigError> {
    let mut out = Vec::new();
    for config in configs {
        for (i, tls) in servers(config).filter(|(_, t)| !t.credential_name.is_empty()) {
            let holders: Vec<&str> = match secret_name(&tls.credential_name) {
                Some(name) => kube
                    .range(secret_key("", "")..)
                    .take_while(|(k, _)| k.kind == KubeKind::Secret)
                    .filter(|(k, _)| k.name == name)
                    .map(|(k, _)| k.namespace.as_str())
                    .collect(),
                None => Vec::new(),
            };
            let problems: Vec<String> = holders.iter().filter_map(|ns| credential_problem(kube, ns, tls)).collect();
            if !holders.is_empty() && problems.len() < holders.len() {
                continue;
            }
            let reason = problems.into_iter().next().or_else(|| credential_problem(kube, &config.key.namespace, tls));
            if let Some(reason) = reason {
                out.push(ConfigError {
                    file: SOURCE.to_string(),
                    document: 0,
                    object: Some(ConfigKey::clone(&config.key)),
                    error: FieldError::new(format!("spec.servers[{i}].tls.credentialName"), reason),
                    policy_selector: None,
                });
            }
        }
    }
    out
}
