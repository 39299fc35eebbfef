//! Payload encoding: a full source state or a delta, as JSON (see the module docs for why).

use std::collections::BTreeSet;
use std::sync::Arc;

use prost::bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Delta, WireError};
use crate::config::parse::object_from_value;
use crate::config::render::IstioDocument;
use crate::config::IgnoredObject;
use crate::config::{ConfigError, ConfigKey, ConfigObjects};
use crate::mesh::{MeshConfig, DEFAULT_DOMAIN};
use crate::registry::kubernetes::{KubeKey, KubeObject, KubeObjects};
use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

/// A decoded full snapshot: the leader's source state and the changes its snapshot carries.
#[derive(Debug, Clone)]
pub struct FullUpdate {
    /// The whole source state.
    pub state: SourceState,
    /// The leader's changes relative to its previous snapshot (not to what a frontend held).
    pub changes: ChangeSet,
}

/// The mesh config with the hash and domain that `MeshConfig`'s serde form leaves out.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MeshOut<'a> {
    config: &'a MeshConfig,
    source_hash: u64,
    domain: &'a str,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MeshIn {
    config: MeshConfig,
    source_hash: u64,
    // A leader from before the domain was carried only ran with the default one.
    #[serde(default = "default_domain")]
    domain: String,
}

fn default_domain() -> String {
    DEFAULT_DOMAIN.to_string()
}

impl MeshIn {
    fn into_mesh(self) -> Arc<MeshConfig> {
        Arc::new(MeshConfig { source_hash: self.source_hash, domain: self.domain, ..self.config })
    }
}

fn mesh_out(mesh: &MeshConfig) -> MeshOut<'_> {
    MeshOut { config: mesh, source_hash: mesh.source_hash, domain: &mesh.domain }
}

#[derive(Serialize)]
struct FullOut<'a> {
    configs: Vec<IstioDocument<'a>>,
    errors: &'a [ConfigError],
    ignored: &'a [IgnoredObject],
    mesh: MeshOut<'a>,
    changes: &'a ChangeSet,
    /// Kubernetes objects in key order; each object carries its key.
    kube: Vec<&'a KubeObject>,
}

// Unknown fields are ignored so that a newer leader can add some during a rolling upgrade.
#[derive(Deserialize)]
struct FullIn {
    configs: Vec<Value>,
    errors: Vec<ConfigError>,
    ignored: Vec<IgnoredObject>,
    mesh: MeshIn,
    changes: ChangeSet,
    // Absent from an older leader's payload: it had no Kubernetes objects.
    #[serde(default)]
    kube: Vec<KubeObject>,
}

#[derive(Serialize)]
struct DeltaOut<'a> {
    upserted: Vec<IstioDocument<'a>>,
    deleted: &'a BTreeSet<ConfigKey>,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<&'a [ConfigError]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ignored: Option<&'a [IgnoredObject]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mesh: Option<MeshOut<'a>>,
    changes: &'a ChangeSet,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    kube_upserted: Vec<&'a KubeObject>,
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    kube_deleted: &'a BTreeSet<KubeKey>,
}

#[derive(Deserialize)]
struct DeltaIn {
    upserted: Vec<Value>,
    deleted: BTreeSet<ConfigKey>,
    #[serde(default)]
    errors: Option<Vec<ConfigError>>,
    #[serde(default)]
    ignored: Option<Vec<IgnoredObject>>,
    #[serde(default)]
    mesh: Option<MeshIn>,
    changes: ChangeSet,
    #[serde(default)]
    kube_upserted: Vec<KubeObject>,
    #[serde(default)]
    kube_deleted: BTreeSet<KubeKey>,
}

/// Encodes a snapshot's whole source state.
pub fn encode_full(snapshot: &Snapshot) -> Result<Bytes, WireError> {
    let out = FullOut {
        configs: snapshot.configs.values().map(|c| IstioDocument(c)).collect(),
        errors: &snapshot.errors,
        ignored: &snapshot.ignored,
        mesh: mesh_out(&snapshot.mesh),
        changes: &snapshot.changes,
        kube: snapshot.kube.values().map(|o| &**o).collect(),
    };
    serde_json::to_vec(&out).map(Bytes::from).map_err(|source| WireError::Encode { kind: "full", source })
}

/// Decodes a full payload.
pub fn decode_full(payload: &[u8]) -> Result<FullUpdate, WireError> {
    let full: FullIn = serde_json::from_slice(payload).map_err(|source| WireError::Json { kind: "full", source })?;
    Ok(FullUpdate {
        state: SourceState {
            configs: objects(full.configs)?,
            errors: Arc::new(full.errors),
            ignored: Arc::new(full.ignored),
            mesh: full.mesh.into_mesh(),
            kube: kube_objects(full.kube)?,
        },
        changes: full.changes,
    })
}

/// Encodes a delta (its versions travel in the chunk headers).
pub fn encode_delta(delta: &Delta) -> Result<Bytes, WireError> {
    let out = DeltaOut {
        upserted: delta.upserted.values().map(|c| IstioDocument(c)).collect(),
        deleted: &delta.deleted,
        errors: delta.errors.as_deref().map(Vec::as_slice),
        ignored: delta.ignored.as_deref().map(Vec::as_slice),
        mesh: delta.mesh.as_deref().map(mesh_out),
        changes: &delta.changes,
        kube_upserted: delta.kube_upserted.values().map(|o| &**o).collect(),
        kube_deleted: &delta.kube_deleted,
    };
    serde_json::to_vec(&out).map(Bytes::from).map_err(|source| WireError::Encode { kind: "delta", source })
}

/// Decodes a delta payload that takes `base` to `version`.
pub fn decode_delta(base: Version, version: Version, payload: &[u8]) -> Result<Delta, WireError> {
    let delta: DeltaIn = serde_json::from_slice(payload).map_err(|source| WireError::Json { kind: "delta", source })?;
    let upserted = objects(delta.upserted)?;
    if let Some(key) = upserted.keys().find(|k| delta.deleted.contains(*k)) {
        return Err(WireError::Duplicate(key.clone()));
    }
    let kube_upserted = kube_objects(delta.kube_upserted)?;
    if let Some(key) = kube_upserted.keys().find(|k| delta.kube_deleted.contains(*k)) {
        return Err(WireError::DuplicateKube(key.clone()));
    }
    Ok(Delta {
        base,
        version,
        upserted,
        deleted: delta.deleted,
        kube_upserted,
        kube_deleted: delta.kube_deleted,
        errors: delta.errors.map(Arc::new),
        ignored: delta.ignored.map(Arc::new),
        mesh: delta.mesh.map(MeshIn::into_mesh),
        changes: delta.changes,
    })
}

/// Parses config documents back into objects; the leader validated them already.
fn objects(docs: Vec<Value>) -> Result<ConfigObjects, WireError> {
    let mut configs = ConfigObjects::new();
    for (index, doc) in docs.into_iter().enumerate() {
        let obj = match object_from_value(doc) {
            Ok(Some(obj)) => obj,
            Ok(None) => return Err(WireError::NotServed { index }),
            Err((key, error)) => return Err(WireError::Document { index, key, error }),
        };
        let key = obj.key.clone();
        if configs.insert(key.clone(), Arc::new(obj)).is_some() {
            return Err(WireError::Duplicate(key));
        }
    }
    Ok(configs)
}

/// Keys Kubernetes objects by their own identity (so a payload cannot file one under another key).
fn kube_objects(objects: Vec<KubeObject>) -> Result<KubeObjects, WireError> {
    let mut kube = KubeObjects::new();
    for obj in objects {
        let key = obj.key();
        if kube.insert(key.clone(), Arc::new(obj)).is_some() {
            return Err(WireError::DuplicateKube(key));
        }
    }
    Ok(kube)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::config::{ConfigObject, FieldError, Kind};
    use crate::registry::kubernetes::{
        KubeEndpointSlice, KubeKind, KubeNamespace, KubeNode, KubePod, KubeService, KubeServicePort, ServiceType,
        SliceEndpoint, SlicePort, TargetPort,
    };
    use crate::snapshot::SnapshotBuilder;

    /// A pod `name` of the ratings deployment at `ip`, labelled `version`.
    pub(crate) fn pod(name: &str, ip: &str, version: &str) -> KubeObject {
        KubeObject::Pod(KubePod {
            name: name.into(),
            namespace: "bookinfo".into(),
            labels: Arc::new(
                [("app".to_string(), "ratings".to_string()), ("version".to_string(), version.to_string())].into(),
            ),
            service_account: "bookinfo-ratings".into(),
            ips: vec![ip.into()],
            node_name: "node-a".into(),
            ready: true,
            terminating: false,
            named_ports: [("http".to_string(), 9080)].into(),
        })
    }

    /// The ratings EndpointSlice with one ready endpoint per `(pod, ip)`.
    pub(crate) fn slice(endpoints: &[(&str, &str)]) -> KubeObject {
        KubeObject::EndpointSlice(KubeEndpointSlice {
            name: "ratings-abcde".into(),
            namespace: "bookinfo".into(),
            service_name: "ratings".into(),
            address_type: "IPv4".into(),
            ports: vec![SlicePort { name: "http".into(), port: Some(9080), protocol: "TCP".into() }],
            endpoints: endpoints
                .iter()
                .map(|(pod, ip)| SliceEndpoint {
                    addresses: vec![ip.to_string()],
                    ready: Some(true),
                    serving: Some(true),
                    terminating: None,
                    pod: Some(pod.to_string()),
                    node_name: Some("node-a".into()),
                })
                .collect(),
        })
    }

    /// Kubernetes objects of the ratings service: the Service, its slice, two pods, their node
    /// and their namespace.
    pub(crate) fn kube_objects() -> KubeObjects {
        let service = KubeObject::Service(KubeService {
            name: "ratings".into(),
            namespace: "bookinfo".into(),
            labels: [("app".to_string(), "ratings".to_string())].into(),
            selector: Some([("app".to_string(), "ratings".to_string())].into()),
            service_type: ServiceType::ClusterIp,
            cluster_ips: vec!["10.96.0.10".into()],
            headless: false,
            external_name: None,
            ports: vec![KubeServicePort {
                name: "http".into(),
                port: 9080,
                protocol: "TCP".into(),
                app_protocol: Some("http".into()),
                target_port: Some(TargetPort::Name("http".into())),
            }],
            export_to: vec![".".into()],
        });
        let node = KubeObject::Node(KubeNode {
            name: "node-a".into(),
            region: "region-1".into(),
            zone: "zone-1".into(),
            subzone: String::new(),
        });
        let namespace = KubeObject::Namespace(KubeNamespace {
            name: "bookinfo".into(),
            labels: [("topology.istio.io/network".to_string(), "net-1".to_string())].into(),
        });
        let objects = [
            service,
            slice(&[("ratings-0", "10.1.0.1"), ("ratings-1", "10.1.0.2")]),
            pod("ratings-0", "10.1.0.1", "v1"),
            pod("ratings-1", "10.1.0.2", "v1"),
            node,
            namespace,
        ];
        objects.into_iter().map(|o| (o.key(), Arc::new(o))).collect()
    }

    /// A ServiceEntry named `name` in namespace `ns`.
    pub(crate) fn object(name: &str) -> ConfigObject {
        let yaml = format!(
            "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{hosts: [{name}.example.com], location: MESH_INTERNAL, resolution: STATIC, ports: [{{number: 80, name: http, protocol: HTTP}}], endpoints: [{{address: 10.0.0.1}}]}}\n"
        );
        match parse_file("t.yaml", &yaml).remove(0) {
            Document::Valid(o) => o,
            other => panic!("{other:?}"),
        }
    }

    /// A source state holding a ServiceEntry per name.
    pub(crate) fn state(names: &[&str]) -> SourceState {
        let mut s = SourceState::default();
        for name in names {
            let o = object(name);
            s.configs.insert(o.key.clone(), Arc::new(o));
        }
        s
    }

    /// The bookinfo example, plus an error, an ignored document and a non-default mesh config.
    fn bookinfo() -> SourceState {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bookinfo");
        let mut s = SourceState::default();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            for doc in parse_file("f.yaml", &std::fs::read_to_string(&path).unwrap()) {
                if let Document::Valid(o) = doc {
                    s.configs.insert(o.key.clone(), Arc::new(o));
                }
            }
        }
        s.errors = Arc::new(vec![ConfigError {
            file: "bad.yaml".into(),
            document: 2,
            object: Some(ConfigKey { kind: Kind::Gateway, namespace: "ns".into(), name: "g".into() }),
            error: FieldError::new("spec.servers[0].port", "Required value"),
            policy_selector: None,
        }]);
        s.ignored = Arc::new(vec![IgnoredObject {
            file: "cm.yaml".into(),
            document: 1,
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "x".into(),
        }]);
        let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mesh.yaml");
        let mesh = MeshConfig::load(std::path::Path::new(mesh)).unwrap();
        s.mesh = Arc::new(MeshConfig { domain: "corp.internal".into(), ..mesh });
        s.kube = kube_objects();
        s
    }

    fn assert_same(a: &Snapshot, b: &Snapshot) {
        assert_eq!(a.version, b.version);
        assert_eq!(a.configs, b.configs);
        assert_eq!(a.registry, b.registry);
        assert_eq!(a.errors, b.errors);
        assert_eq!(a.ignored, b.ignored);
        assert_eq!(a.mesh, b.mesh);
        assert_eq!(a.kube, b.kube);
    }

    #[test]
    fn full_round_trip_rebuilds_the_same_snapshot() {
        let leader = Snapshot::build(Version::new(3, 7), ChangeSet::full(), &bookinfo());
        assert!(leader.configs.len() > 5 && !leader.registry.services.is_empty() && leader.kube.len() == 6);
        let full = decode_full(&encode_full(&leader).unwrap()).unwrap();
        assert_eq!(full.changes, leader.changes);
        assert_same(&leader, &Snapshot::build(leader.version, full.changes, &full.state));
    }

    #[test]
    fn gateway_credentials_reach_frontends_and_their_errors_are_not_doubled() {
        use crate::registry::kubernetes::{KubeSecret, PrivateKey};
        let mut state = bookinfo();
        let yaml = "apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: ns}\nspec:\n  \
                    selector: {istio: ingress}\n  servers:\n  - port: {number: 443, name: https, protocol: HTTPS}\n    \
                    hosts: [a.example.com]\n    tls: {mode: SIMPLE, credentialName: cert}\n  \
                    - port: {number: 8443, name: https-2, protocol: HTTPS}\n    hosts: [b.example.com]\n    \
                    tls: {mode: SIMPLE, credentialName: missing}\n";
        let Document::Valid(gw) = parse_file("gw.yaml", yaml).remove(0) else { panic!() };
        state.configs.insert(gw.key.clone(), Arc::new(gw));
        let secret = KubeObject::Secret(KubeSecret {
            name: "cert".into(),
            namespace: "istio-system".into(),
            cert_chain: "CERT".into(),
            private_key: PrivateKey("KEY".into()),
            ca: String::new(),
        });
        state.kube.insert(secret.key(), Arc::new(secret));
        let leader = Snapshot::build(Version::new(3, 8), ChangeSet::full(), &state);
        assert_eq!(leader.errors.len(), state.errors.len() + 1, "the missing credential: {:?}", leader.errors);
        let full = decode_full(&encode_full(&leader).unwrap()).unwrap();
        let frontend = Snapshot::build(leader.version, full.changes, &full.state);
        assert_same(&leader, &frontend);
        assert_eq!(
            frontend.credentials_in("istio-system").map(|s| s.private_key.0.as_str()).collect::<Vec<_>>(),
            ["KEY"]
        );
    }

    #[test]
    fn delta_round_trip_rebuilds_the_same_snapshot() {
        let mut s = bookinfo();
        let s1 = Snapshot::build(Version::new(1, 1), ChangeSet::full(), &s);
        let first = s.configs.keys().next().unwrap().clone();
        s.configs.remove(&first);
        let o = object("added");
        s.configs.insert(o.key.clone(), Arc::new(o));
        s.errors = Arc::new(Vec::new());
        s.mesh = Arc::new(MeshConfig::default());
        // A pod relabelled, one gone (and out of the slice), one added; the node goes.
        let kube = &mut s.kube;
        kube.remove(&pod("ratings-1", "", "").key());
        kube.remove(&KubeKey { kind: KubeKind::Node, namespace: String::new(), name: "node-a".into() });
        for o in [
            pod("ratings-0", "10.1.0.1", "v2"),
            pod("ratings-2", "10.1.0.3", "v1"),
            slice(&[("ratings-0", "10.1.0.1"), ("ratings-2", "10.1.0.3")]),
        ] {
            kube.insert(o.key(), Arc::new(o));
        }
        let s2 = Snapshot::build(Version::new(1, 2), ChangeSet::default(), &s);

        let delta = Delta::between(&s1, &s2);
        assert_eq!(delta.kube_upserted.len(), 3);
        assert_eq!(delta.kube_deleted.len(), 2);
        let decoded = decode_delta(s1.version, s2.version, &encode_delta(&delta).unwrap()).unwrap();
        assert_eq!(decoded, delta);
        assert_eq!(decoded.mesh.as_ref().map(|m| m.domain.as_str()), Some(DEFAULT_DOMAIN));
        let mut frontend = SnapshotBuilder::resume(Arc::new(s1));
        decoded.apply_to(&mut frontend);
        assert_same(&s2, &frontend.build(s2.version, decoded.changes));
    }

    #[test]
    fn bad_payloads_are_typed_errors() {
        assert!(matches!(decode_full(b"{not json"), Err(WireError::Json { .. })));
        assert!(matches!(decode_full(b"[]"), Err(WireError::Json { .. })));
        let v = Version::new(1, 2);
        assert!(matches!(decode_delta(v, v, &[0xff, 0, 1]), Err(WireError::Json { .. })));

        let empty = encode_full(&Snapshot::build(v, ChangeSet::full(), &SourceState::default())).unwrap();
        let mut doc: Value = serde_json::from_slice(&empty).unwrap();
        doc["configs"] = serde_json::json!([{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}]);
        assert!(matches!(decode_full(doc.to_string().as_bytes()), Err(WireError::NotServed { index: 0 })));
        doc["configs"] = serde_json::json!([{"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
            "metadata": {"name": "g"}, "spec": {"servers": "nope"}}]);
        assert!(matches!(decode_full(doc.to_string().as_bytes()), Err(WireError::Document { index: 0, .. })));
        let se = serde_json::to_value(IstioDocument(&object("a"))).unwrap();
        doc["configs"] = serde_json::json!([se.clone(), se]);
        assert!(matches!(decode_full(doc.to_string().as_bytes()), Err(WireError::Duplicate(_))));
    }

    #[test]
    fn an_older_leaders_payloads_decode_without_kubernetes_objects() {
        let leader = Snapshot::build(Version::new(3, 7), ChangeSet::full(), &bookinfo());
        let mut doc: Value = serde_json::from_slice(&encode_full(&leader).unwrap()).unwrap();
        let Some(root) = doc.as_object_mut() else { panic!("{doc}") };
        root.remove("kube");
        let Some(mesh) = root.get_mut("mesh").and_then(Value::as_object_mut) else { panic!("{doc}") };
        mesh.remove("domain");
        let full = decode_full(doc.to_string().as_bytes()).unwrap();
        assert!(full.state.kube.is_empty());
        assert_eq!(full.state.mesh.domain, DEFAULT_DOMAIN);
        assert_eq!(full.state.configs, leader.configs);

        let v = Version::new(1, 2);
        let old_delta = serde_json::json!({"upserted": [], "deleted": [], "changes": {"full": false, "keys": []}});
        let delta = decode_delta(Version::new(1, 1), v, old_delta.to_string().as_bytes()).unwrap();
        assert!(delta.kube_upserted.is_empty() && delta.kube_deleted.is_empty());
    }

    #[test]
    fn bad_kubernetes_objects_are_typed_errors() {
        let v = Version::new(1, 2);
        let state = SourceState { kube: kube_objects(), ..Default::default() };
        let mut doc: Value =
            serde_json::from_slice(&encode_full(&Snapshot::build(v, ChangeSet::full(), &state)).unwrap()).unwrap();
        let first = doc["kube"][0].clone();
        doc["kube"] = serde_json::json!([first.clone(), first]);
        assert!(matches!(decode_full(doc.to_string().as_bytes()), Err(WireError::DuplicateKube(_))));
        doc["kube"] = serde_json::json!([{"Pod": {"name": "p"}}]);
        assert!(matches!(decode_full(doc.to_string().as_bytes()), Err(WireError::Json { .. })));

        let p = pod("ratings-0", "10.1.0.1", "v1");
        let delta = serde_json::json!({"upserted": [], "deleted": [], "changes": {"full": false, "keys": []},
            "kube_upserted": [serde_json::to_value(&p).unwrap()], "kube_deleted": [p.key()]});
        let err = decode_delta(Version::new(1, 1), v, delta.to_string().as_bytes()).unwrap_err();
        assert!(matches!(err, WireError::DuplicateKube(ref k) if *k == p.key()), "{err}");
    }

    /// The committed seeds of the `wire` fuzz target (`fuzz/corpus/wire/seed-*`) replayed through
    /// the decoders the target feeds (the test command's share of fuzzing; `scripts/fuzz.sh` does
    /// the rest): a seed whose control byte has bit 6 clear carries a payload, a delta one with
    /// bit 0 set. They are real payloads and must still decode (a seed the format left behind
    /// would only fuzz the JSON parser).
    #[test]
    fn wire_seeds_replay_as_the_fuzz_target_runs_them() {
        let mut payloads = 0;
        for (name, data) in crate::config::fuzz_seeds::seeds("wire") {
            let Some((&control, rest)) = data.split_first() else { continue };
            let (base, version) = (Version::new(1, 1), Version::new(1, 2));
            let (full, delta) = (decode_full(rest), decode_delta(base, version, rest));
            match control & 0x41 {
                0 => assert!(full.is_ok(), "{name}: {:?}", full.err()),
                1 => assert!(delta.is_ok(), "{name}: {:?}", delta.err()),
                _ => continue,
            }
            payloads += 1;
        }
        assert!(payloads >= 4, "the payload seeds are gone");
    }
}
