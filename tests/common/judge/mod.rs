//! The differential judge: real istiod and meshpilot on the same inputs, the same simulated
//! proxies connected to both, and what each proxy gets compared resource by resource and field
//! by field. Differences Envoy does not see as behaviour are normalised away
//! ([`normalise`], each rule with its reason); differences meshpilot makes on purpose are
//! declared with theirs ([`declared`]); everything else is a disagreement, reported with a diff.

/// The inputs of one comparison: Istio config, Kubernetes objects, proxies; and the corpora.
pub mod case;
/// Two servers' resources compared field by field.
pub mod compare;
/// Differences meshpilot makes on purpose (`tests/testdata/differential/declared.yaml`).
pub mod declared;
/// Istio's pilot-discovery, started on a config dir and a kube-apiserver.
pub mod istiod;
/// Rewrites of both servers' JSON that Envoy's behaviour does not depend on.
pub mod normalise;
/// The simulated proxies of a case and the node metadata pilot-agent sends.
pub mod proxies;
/// Agreement tables, diffs, the markdown and JSON report, and the baseline ratchet.
pub mod report;
/// One case run against both servers.
pub mod run;
/// The few Go-template constructs Istio's benchmark inputs use, rendered.
pub mod template;
