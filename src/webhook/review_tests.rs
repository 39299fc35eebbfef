use serde_json::{json, Value};

use super::*;

fn virtual_service(hosts: Value) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews"},
        "spec": {"hosts": hosts, "http": [{"route": [{"destination": {"host": "reviews"}}]}]},
    })
}

fn request(operation: &str, object: Option<Value>) -> AdmissionRequest {
    let kind = object.as_ref().and_then(|o| o.get("kind")).and_then(Value::as_str).unwrap_or_default().to_string();
    AdmissionRequest {
        uid: "705ab4f5-6393-11e8-b7cc-42010a800002".into(),
        kind: GroupVersionKind { group: "networking.istio.io".into(), version: "v1".into(), kind },
        namespace: "bookinfo".into(),
        name: "reviews".into(),
        operation: operation.into(),
        object,
        ..Default::default()
    }
}

fn message(verdict: &Verdict) -> &str {
    verdict.message.as_deref().unwrap_or_default()
}

#[test]
fn a_valid_virtual_service_is_allowed() {
    let verdict = review(&request("CREATE", Some(virtual_service(json!(["reviews"])))));
    assert!(verdict.allowed, "{verdict:?}");
    assert_eq!(verdict.message, None);
}

#[test]
fn an_invalid_virtual_service_is_denied_with_the_field_path() {
    let verdict = review(&request("UPDATE", Some(virtual_service(json!(["bad host"])))));
    assert!(!verdict.allowed);
    assert!(message(&verdict).starts_with("configuration is invalid: spec.hosts[0]"), "{verdict:?}");
    assert_eq!(verdict.reason, Some(Reason::InvalidResource));
}

#[test]
fn a_spec_that_does_not_parse_is_a_decoding_error() {
    let mut vs = virtual_service(json!(["reviews"]));
    vs["spec"]["http"][0]["route"][0]["weight"] = json!("heavy");
    let verdict = review(&request("CREATE", Some(vs)));
    assert!(!verdict.allowed);
    let text = message(&verdict);
    assert!(text.starts_with("error decoding configuration: spec.http[0].route[0].weight"), "{text}");
    assert_eq!(verdict.reason, Some(Reason::ConversionError));
}

#[test]
fn an_unknown_spec_field_is_allowed_with_a_warning_naming_it() {
    let mut vs = virtual_service(json!(["reviews"]));
    vs["spec"]["http"][0]["route"][0]["wieght"] = json!(3);
    let verdict = review(&request("CREATE", Some(vs)));
    assert!(verdict.allowed, "{verdict:?}");
    assert_eq!(verdict.warnings, ["spec.http[0].route[0].wieght: unknown field `wieght`, ignored as Istio ignores it"]);
}

#[test]
fn an_unknown_field_of_a_security_policy_is_denied() {
    let policy = json!({
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": "default"},
        "spec": {"mtls": {"mode": "STRICT", "strict": true}},
    });
    let verdict = review(&request("CREATE", Some(policy)));
    assert!(!verdict.allowed);
    assert!(message(&verdict).contains("spec.mtls.strict: unknown field `strict`"), "{verdict:?}");
}

#[test]
fn an_invalid_spec_is_reported_before_an_unknown_top_level_field() {
    let mut vs = virtual_service(json!(["bad host"]));
    vs["extra"] = json!(1);
    let verdict = review(&request("CREATE", Some(vs)));
    assert!(message(&verdict).starts_with("configuration is invalid: spec.hosts[0]"), "{verdict:?}");
}

#[test]
fn an_unknown_top_level_field_is_denied() {
    let mut vs = virtual_service(json!(["reviews"]));
    vs["extra"] = json!({"a": 1});
    let verdict = review(&request("CREATE", Some(vs)));
    assert!(!verdict.allowed);
    assert_eq!(message(&verdict), r#"unknown field "extra" on VirtualService resource bookinfo/reviews"#);
}

#[test]
fn status_is_a_known_top_level_field() {
    let mut vs = virtual_service(json!(["reviews"]));
    vs["status"] = json!({"observedGeneration": 1});
    assert!(review(&request("CREATE", Some(vs))).allowed);
}

#[test]
fn other_operations_are_allowed_unvalidated() {
    for operation in ["DELETE", "CONNECT"] {
        let verdict = review(&request(operation, None));
        assert!(verdict.allowed, "{operation}");
        // Even a broken object: only CREATE and UPDATE are validated.
        assert!(review(&request(operation, Some(json!("not an object")))).allowed, "{operation}");
    }
}

#[test]
fn an_unrecognized_kind_is_denied() {
    let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}});
    let verdict = review(&request("CREATE", Some(object)));
    assert!(!verdict.allowed);
    assert_eq!(message(&verdict), "unrecognized type /v1, Kind=ConfigMap");
    let object = json!({"apiVersion": "networking.istio.io/v1", "kind": "Nonsense", "metadata": {"name": "x"}});
    assert_eq!(
        message(&review(&request("CREATE", Some(object)))),
        "unrecognized type networking.istio.io/v1, Kind=Nonsense"
    );
}

#[test]
fn an_istio_kind_meshpilot_does_not_serve_is_allowed_with_a_warning() {
    let object = json!({
        "apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
        "metadata": {"name": "f"}, "spec": {"anything": true},
    });
    let verdict = review(&request("CREATE", Some(object)));
    assert!(verdict.allowed);
    assert_eq!(verdict.warnings.len(), 1, "{verdict:?}");
    assert!(verdict.warnings[0].contains("EnvoyFilter"), "{:?}", verdict.warnings);
}

#[test]
fn an_undecodable_object_is_denied() {
    for object in [json!("text"), json!([1, 2]), json!({"apiVersion": 7, "kind": "VirtualService"})] {
        let verdict = review(&request("CREATE", Some(object.clone())));
        assert!(!verdict.allowed, "{object}");
        assert!(message(&verdict).starts_with("cannot decode configuration: "), "{verdict:?}");
    }
    let verdict = review(&request("CREATE", None));
    assert!(message(&verdict).starts_with("cannot decode configuration: "), "{verdict:?}");
}

#[test]
fn the_response_echoes_the_uid_and_is_an_admission_review() {
    let review = AdmissionReview {
        api_version: ADMISSION_API_VERSION.into(),
        kind: ADMISSION_KIND.into(),
        request: Some(request("CREATE", Some(virtual_service(json!(["bad host"]))))),
    };
    let (answer, _) = respond(&review);
    let answer = serde_json::to_value(&answer).expect("serialises");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert_eq!(answer["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(answer["response"]["allowed"], false);
    assert_eq!(answer["response"]["status"]["code"], 400);
    let text = answer["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(text.starts_with("configuration is invalid: "), "{answer}");
}

#[test]
fn an_authorization_policy_with_action_custom_needs_a_provider() {
    // As istiod: CUSTOM with a provider is admitted (whether the mesh config has that provider is
    // known only where the policy is enforced); without one it is refused.
    let custom = |spec: serde_json::Value| {
        json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "ext", "namespace": "bookinfo"},
            "spec": spec,
        })
    };
    let verdict = review(&request(
        "CREATE",
        Some(custom(json!({"action": "CUSTOM", "provider": {"name": "ext-authz"}, "rules": [{}]}))),
    ));
    assert!(verdict.allowed, "{verdict:?}");
    let verdict = review(&request("CREATE", Some(custom(json!({"action": "CUSTOM", "rules": [{}]})))));
    assert!(!verdict.allowed);
    assert!(message(&verdict).starts_with("configuration is invalid: "), "{verdict:?}");
    assert!(message(&verdict).contains("`provider.name` must not be empty"), "{verdict:?}");
}

#[test]
fn the_request_namespace_is_the_object_namespace_when_it_names_none() {
    let mut vs = virtual_service(json!(["reviews"]));
    vs["bogus"] = json!(1);
    let verdict = review(&request("CREATE", Some(vs.clone())));
    assert!(message(&verdict).ends_with("bookinfo/reviews"), "{verdict:?}");
    vs["metadata"]["namespace"] = json!("other");
    let verdict = review(&request("CREATE", Some(vs)));
    assert!(message(&verdict).ends_with("other/reviews"), "{verdict:?}");
}

#[test]
fn dry_runs_are_validated_the_same_way() {
    let mut dry = request("CREATE", Some(virtual_service(json!(["bad host"]))));
    dry.dry_run = Some(true);
    let verdict = review(&dry);
    assert!(!verdict.allowed);
    assert!(message(&verdict).starts_with("configuration is invalid: spec.hosts[0]"), "{verdict:?}");
}
