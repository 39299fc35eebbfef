//! Rendering a config object back to its Istio document (apiVersion, kind, metadata, spec).

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};
use serde_json::Value;

use super::object::ConfigObject;

/// A config object serialized as the Istio document it was parsed from; `parse::object_from_value`
/// reads it back to an equal object.
#[derive(Debug, Clone, Copy)]
pub struct IstioDocument<'a>(pub &'a ConfigObject);

/// `metadata` as Istio writes it; empty label and annotation maps are left out.
struct Metadata<'a>(&'a ConfigObject);

impl Serialize for IstioDocument<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let obj = self.0;
        let mut map = s.serialize_map(Some(4))?;
        map.serialize_entry("apiVersion", &obj.meta.api_version)?;
        map.serialize_entry("kind", obj.key.kind.name())?;
        map.serialize_entry("metadata", &Metadata(obj))?;
        map.serialize_entry("spec", &obj.spec)?;
        map.end()
    }
}

impl Serialize for Metadata<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let obj = self.0;
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("name", &obj.key.name)?;
        map.serialize_entry("namespace", &obj.key.namespace)?;
        if !obj.meta.labels.is_empty() {
            map.serialize_entry("labels", &obj.meta.labels)?;
        }
        if !obj.meta.annotations.is_empty() {
            map.serialize_entry("annotations", &obj.meta.annotations)?;
        }
        map.end()
    }
}

/// The Istio document of a config object as a JSON value.
pub fn object_to_value(obj: &ConfigObject) -> Result<Value, serde_json::Error> {
    serde_json::to_value(IstioDocument(obj))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse::{object_from_value, parse_file, Document};

    /// Every valid object of the examples survives render → parse unchanged.
    #[test]
    fn examples_round_trip() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/bookinfo");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for doc in parse_file(&path.display().to_string(), &text) {
                let Document::Valid(obj) = doc else { continue };
                let value = object_to_value(&obj).unwrap();
                let back = object_from_value(value.clone()).unwrap().unwrap();
                assert_eq!(back, obj, "{value}");
                seen += 1;
            }
        }
        assert!(seen > 5, "only {seen} objects in {dir}");
    }

    #[test]
    fn metadata_keeps_labels_and_annotations() {
        let yaml = "apiVersion: networking.istio.io/v1alpha3\nkind: Sidecar\nmetadata: {name: s, namespace: ns, labels: {a: b}, annotations: {c: d}}\nspec: {egress: [{hosts: ['./*']}]}\n";
        let Document::Valid(obj) = parse_file("s.yaml", yaml).remove(0) else { panic!() };
        let value = object_to_value(&obj).unwrap();
        assert_eq!(value["apiVersion"], "networking.istio.io/v1alpha3");
        assert_eq!(value["metadata"]["labels"]["a"], "b");
        assert_eq!(value["metadata"]["annotations"]["c"], "d");
        assert_eq!(object_from_value(value).unwrap().unwrap(), obj);
    }

    /// Numbers survive exactly (serde_json's `float_roundtrip`), fractional durations too.
    #[test]
    fn floats_and_durations_survive_exactly() {
        let yaml = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\nspec:\n  hosts: [a]\n  http:\n  - route: [{destination: {host: a}}]\n    timeout: 1.234s\n    fault: {delay: {fixedDelay: 2s, percentage: {value: 12.345678912345678}}}\n";
        let obj = match parse_file("r.yaml", yaml).remove(0) {
            Document::Valid(obj) => obj,
            other => panic!("{other:?}"),
        };
        let text = serde_json::to_vec(&IstioDocument(&obj)).unwrap();
        let value: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(object_from_value(value).unwrap().unwrap(), obj);
    }
}
