//! Payload encoding: a full source state or a delta, as JSON (see the module docs for why).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use prost::bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Delta, WireError};
use crate::config::parse::object_from_value;
use crate::config::render::IstioDocument;
use crate::config::IgnoredObject;
use crate::config::{ConfigError, ConfigKey, ValidConfig};
use crate::mesh::MeshConfig;
use crate::snapshot::{ChangeSet, Snapshot, SourceState, Version};

/// A decoded full snapshot: the leader's source state and the changes its snapshot carries.
#[derive(Debug, Clone)]
pub struct FullUpdate {
    /// The whole source state.
    pub state: SourceState,
    /// The leader's changes relative to its previous snapshot (not to what a frontend held).
    pub changes: ChangeSet,
}

/// The mesh config with the hash and DNS domain that `MeshConfig`'s serde form leaves out.
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
    /// Absent from an older leader's payload: the config's default stays.
    #[serde(default)]
    domain: Option<String>,
}

impl MeshIn {
    fn into_mesh(self) -> Arc<MeshConfig> {
        let domain = self.domain.unwrap_or(self.config.domain.clone());
        Arc::new(MeshConfig { source_hash: self.source_hash, domain, ..self.config })
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
}

// Unknown fields are ignored so that a newer leader can add some during a rolling upgrade.
#[derive(Deserialize)]
struct FullIn {
    configs: Vec<Value>,
    errors: Vec<ConfigError>,
    ignored: Vec<IgnoredObject>,
    mesh: MeshIn,
    changes: ChangeSet,
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
}

/// Encodes a snapshot's whole source state.
pub fn encode_full(snapshot: &Snapshot) -> Result<Bytes, WireError> {
    let out = FullOut {
        configs: snapshot.configs.values().map(|c| IstioDocument(c)).collect(),
        errors: &snapshot.errors,
        ignored: &snapshot.ignored,
        mesh: mesh_out(&snapshot.mesh),
        changes: &snapshot.changes,
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
            kube: Default::default(),
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
    Ok(Delta {
        base,
        version,
        upserted,
        deleted: delta.deleted,
        errors: delta.errors.map(Arc::new),
        ignored: delta.ignored.map(Arc::new),
        mesh: delta.mesh.map(MeshIn::into_mesh),
        changes: delta.changes,
    })
}

/// Parses config documents back into objects; the leader validated them already.
fn objects(docs: Vec<Value>) -> Result<BTreeMap<ConfigKey, ValidConfig>, WireError> {
    let mut configs = BTreeMap::new();
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::config::parse::{parse_file, Document};
    use crate::config::{ConfigObject, FieldError, Kind};

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
        }]);
        s.ignored = Arc::new(vec![IgnoredObject {
            file: "cm.yaml".into(),
            document: 1,
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "x".into(),
        }]);
        let mesh = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/mesh.yaml");
        s.mesh = Arc::new(MeshConfig::load(std::path::Path::new(mesh)).unwrap());
        s
    }

    fn assert_same(a: &Snapshot, b: &Snapshot) {
        assert_eq!(a.version, b.version);
        assert_eq!(a.configs, b.configs);
        assert_eq!(a.registry, b.registry);
        assert_eq!(a.errors, b.errors);
        assert_eq!(a.ignored, b.ignored);
        assert_eq!(a.mesh, b.mesh);
    }

    #[test]
    fn full_round_trip_rebuilds_the_same_snapshot() {
        let leader = Snapshot::build(Version::new(3, 7), ChangeSet::full(), &bookinfo());
        assert!(leader.configs.len() > 5 && !leader.registry.services.is_empty());
        let full = decode_full(&encode_full(&leader).unwrap()).unwrap();
        assert_eq!(full.changes, leader.changes);
        assert_same(&leader, &Snapshot::build(leader.version, full.changes, &full.state));
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
        let s2 = Snapshot::build(Version::new(1, 2), ChangeSet::default(), &s);

        let delta = Delta::between(&s1, &s2);
        let decoded = decode_delta(s1.version, s2.version, &encode_delta(&delta).unwrap()).unwrap();
        assert_eq!(decoded, delta);
        let mut frontend = SourceState {
            configs: s1.configs.clone(),
            errors: s1.errors.clone(),
            ignored: s1.ignored.clone(),
            mesh: s1.mesh.clone(),
            kube: s1.kube.clone(),
        };
        decoded.apply_to(&mut frontend);
        assert_same(&s2, &Snapshot::build(s2.version, decoded.changes, &frontend));
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
}
