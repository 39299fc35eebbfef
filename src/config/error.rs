//! Errors found in config files: where (file, document, object, field) and why.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::object::ConfigKey;

/// A problem with one field of a config object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldError {
    /// Field path as Istio names it, e.g. `spec.http[0].route[1].weight`.
    pub field: String,
    /// Why the value is wrong.
    pub reason: String,
}

impl FieldError {
    /// A new error at `field`.
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError { field: field.into(), reason: reason.into() }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// A rejected document, with everything a user needs to find it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub struct ConfigError {
    /// File the document came from.
    pub file: String,
    /// 1-based index of the document within the file; 0 for the file (or directory) as a whole,
    /// e.g. when it cannot be read.
    pub document: usize,
    /// The object, when its kind/namespace/name could be read.
    pub object: Option<ConfigKey>,
    /// What is wrong.
    pub error: FieldError,
    /// For a rejected AuthorizationPolicy: the workload selector it was written with, when it
    /// could be read. Its scope stays denied (the snapshot's security index), so the
    /// selector narrows that scope to the workloads the author meant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_selector: Option<super::api::Labels>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.document > 0 {
            write!(f, ": document {}", self.document)?;
        }
        if let Some(key) = &self.object {
            write!(f, " ({key})")?;
        }
        if self.error.field.is_empty() {
            write!(f, ": {}", self.error.reason)
        } else {
            write!(f, ": {}", self.error)
        }
    }
}

/// A document the sources saw but do not serve.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IgnoredObject {
    /// File.
    pub file: String,
    /// 1-based document index.
    pub document: usize,
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// `metadata.name`.
    pub name: String,
}
