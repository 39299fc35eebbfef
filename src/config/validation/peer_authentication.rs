//! PeerAuthentication rules (Istio's `ValidatePeerAuthentication`): port-level modes only on
//! workload policies, ports in range, and a valid selector.

use crate::config::api::PeerAuthentication;

use super::field_errors::{forbidden, invalid, required, Errors};
use super::labels::check_selector;

/// Checks a PeerAuthentication.
pub(super) fn validate(pa: &PeerAuthentication, errors: &mut Errors) {
    let selector_empty = pa.selector_labels().is_none();
    if let Some(ports) = &pa.port_level_mtls {
        if selector_empty && !ports.is_empty() {
            errors
                .add("spec.portLevelMtls", forbidden("mesh/namespace peer authentication cannot have port level mTLS"));
        }
        if ports.is_empty() {
            errors.add("spec.portLevelMtls", required("port level mTLS, if defined, must have at least one element"));
        }
        for port in ports.keys() {
            if *port == 0 || *port > 65535 {
                errors.add(format!("spec.portLevelMtls[{port}]"), invalid(port, "port must be in range 1..65535"));
            }
        }
    }
    if let Some(selector) = &pa.selector {
        check_selector(errors, "spec.selector.matchLabels", &selector.match_labels);
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse::{parse_file, Document};

    fn errors(spec: &str) -> Vec<String> {
        let yaml = format!(
            "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\nmetadata: {{name: p, namespace: ns}}\nspec: {spec}\n"
        );
        match parse_file("pa.yaml", &yaml).remove(0) {
            Document::Valid(_) => Vec::new(),
            Document::Invalid(e) => vec![format!("{}: {}", e.error.field, e.error.reason)],
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rules_follow_istio() {
        assert!(errors("{mtls: {mode: STRICT}}").is_empty());
        assert!(errors("{selector: {matchLabels: {app: a}}, portLevelMtls: {8080: {mode: DISABLE}}}").is_empty());
        let e = errors("{portLevelMtls: {8080: {mode: DISABLE}}}");
        assert!(e[0].starts_with("spec.portLevelMtls: Forbidden: mesh/namespace"), "{e:?}");
        let e = errors("{selector: {matchLabels: {app: a}}, portLevelMtls: {}}");
        assert!(e[0].contains("at least one element"), "{e:?}");
        let e = errors("{selector: {matchLabels: {app: a}}, portLevelMtls: {70000: {mode: STRICT}}}");
        assert!(e[0].starts_with("spec.portLevelMtls[70000]"), "{e:?}");
        let e = errors("{selector: {matchLabels: {app: '*'}}}");
        assert!(e[0].contains("wildcard"), "{e:?}");
        let e = errors("{mtls: {mode: ON}}");
        assert!(e[0].starts_with("spec.mtls.mode"), "{e:?}");
    }

    #[test]
    fn only_the_security_group_at_v1_or_v1beta1() {
        let doc = |api: &str| {
            let yaml = format!("apiVersion: {api}\nkind: PeerAuthentication\nmetadata: {{name: p}}\nspec: {{}}\n");
            parse_file("pa.yaml", &yaml).remove(0)
        };
        assert!(matches!(doc("security.istio.io/v1"), Document::Valid(_)));
        assert!(matches!(doc("networking.istio.io/v1"), Document::Ignored { .. }));
        let Document::Invalid(e) = doc("security.istio.io/v1alpha3") else { panic!() };
        assert_eq!(e.error.field, "apiVersion");
    }
}
