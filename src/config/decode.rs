//! Decoding part of a document into its Istio type, keeping the paths of the fields it could not
//! take: the field that failed to decode, and the fields the type does not have.
//!
//! Istio's decoding of stored config drops fields its types lack (a field a newer release added,
//! or an older one removed), so an unknown field is not an error here: the caller decides what it
//! is (a warning for networking kinds; an error for security policies, which fail closed).

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::FieldError;

/// A decoded value and the full paths of the fields its type does not have.
#[derive(Debug)]
pub struct Decoded<T> {
    /// The value.
    pub value: T,
    /// Paths of fields present in the input and absent from the type, e.g. `spec.http[0].retires`.
    pub unknown: Vec<String>,
}

/// Decodes `value` (found at `path`, e.g. `spec`) as `T`; a failure names the field that failed.
pub fn decode<T: DeserializeOwned>(value: Value, path: &str) -> Result<Decoded<T>, FieldError> {
    let mut unknown = Vec::new();
    let mut record = |field: serde_ignored::Path<'_>| unknown.push(join(path, &field_path(&field)));
    let ignored = serde_ignored::Deserializer::new(value, &mut record);
    let decoded = serde_path_to_error::deserialize(ignored);
    match decoded {
        Ok(value) => Ok(Decoded { value, unknown }),
        Err(e) => {
            let inner = e.path().to_string();
            let field = if inner == "." { path.to_string() } else { join(path, &inner) };
            Err(FieldError::new(field, e.into_inner().to_string()))
        }
    }
}

/// The reason given for an unknown field at `path`: its last name, quoted as serde does.
pub fn unknown_field_reason(path: &str) -> String {
    let name = path.rsplit(['.', '[']).next().unwrap_or(path).trim_end_matches(']');
    format!("unknown field `{name}`")
}

/// `http[0].route` in the notation of field errors (serde_ignored writes `http.0.route`).
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => join(&field_path(parent), key),
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// `spec` + `hosts[0]` = `spec.hosts[0]`; either part may be empty.
fn join(prefix: &str, field: &str) -> String {
    match (prefix.is_empty(), field.is_empty()) {
        (true, _) => field.to_string(),
        (false, true) => prefix.to_string(),
        (false, false) if field.starts_with('[') => format!("{prefix}{field}"),
        (false, false) => format!("{prefix}.{field}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Route {
        #[serde(default)]
        hosts: Vec<String>,
        #[serde(default)]
        http: Vec<Http>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Http {
        #[serde(default)]
        name: Option<String>,
    }

    #[test]
    fn unknown_fields_are_listed_with_their_paths_and_the_rest_decodes() {
        let value = serde_json::json!({"hosts": ["a"], "hsots": 1, "http": [{"name": "n"}, {"retires": 3}]});
        let decoded: Decoded<Route> = decode(value, "spec").expect("decodes");
        assert_eq!(decoded.value.hosts, ["a"]);
        assert_eq!(decoded.value.http[0].name.as_deref(), Some("n"));
        assert_eq!(decoded.unknown, ["spec.hsots", "spec.http[1].retires"]);
        assert_eq!(unknown_field_reason(&decoded.unknown[1]), "unknown field `retires`");
    }

    #[test]
    fn a_field_of_the_wrong_type_is_an_error_at_its_path() {
        let value = serde_json::json!({"http": [{"name": 5}]});
        let err = decode::<Route>(value, "spec").expect_err("wrong type");
        assert_eq!(err.field, "spec.http[0].name");
        assert!(err.reason.contains("invalid type"), "{}", err.reason);
        let err = decode::<Route>(serde_json::json!("text"), "spec").expect_err("not an object");
        assert_eq!(err.field, "spec");
    }
}
