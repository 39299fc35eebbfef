//! The errors and warnings found in one object, and the wording of their reasons (that of
//! Kubernetes' field errors: `Required value`, `Invalid value`, ...).

use std::fmt::{Debug, Display};

use crate::config::error::FieldError;

/// The errors (and warnings) found in one object, in the order they were found.
#[derive(Debug, Default)]
pub(super) struct Errors {
    pub(super) found: Vec<FieldError>,
    pub(super) warnings: Vec<FieldError>,
}

impl Errors {
    /// Records an error at `field`.
    pub(super) fn add(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.found.push(FieldError::new(field, reason));
    }

    /// Records a warning at `field`: the object stays valid.
    pub(super) fn warn(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.warnings.push(FieldError::new(field, reason));
    }

    /// Records the error of `result`, if any, at `field`.
    pub(super) fn check(&mut self, field: impl Into<String>, result: Result<(), String>) {
        if let Err(reason) = result {
            self.add(field, reason);
        }
    }
}

/// Reason for a missing field.
pub(super) fn required(detail: impl Display) -> String {
    format!("Required value: {detail}")
}

/// Reason for a field whose value breaks a rule.
pub(super) fn invalid(value: impl Debug, detail: impl Display) -> String {
    format!("Invalid value: {value:?}: {detail}")
}

/// Reason for a value that repeats an earlier one where values must be unique.
pub(super) fn duplicate(value: impl Debug, detail: impl Display) -> String {
    format!("Duplicate value: {value:?}: {detail}")
}

/// Reason for a field that may not be set (in this combination).
pub(super) fn forbidden(detail: impl Display) -> String {
    format!("Forbidden: {detail}")
}

/// Reason for a list longer than its schema allows.
pub(super) fn too_many(count: usize, max: usize) -> String {
    format!("Too many: {count}: must have at most {max} items")
}

/// Reason for a value outside an enumeration.
pub(super) fn unsupported(value: impl Debug, supported: &[&str]) -> String {
    let list: Vec<String> = supported.iter().map(|s| format!("{s:?}")).collect();
    format!("Unsupported value: {value:?}: supported values: {}", list.join(", "))
}

/// Checks an optional integer that must not be negative.
pub(super) fn check_non_negative(errors: &mut Errors, field: impl Into<String>, value: Option<i32>) {
    if let Some(v) = value.filter(|v| *v < 0) {
        errors.add(field, invalid(v, "must be greater than or equal to 0"));
    }
}

/// Checks an optional percentage (0–100).
pub(super) fn check_percent_range<T: Into<f64> + Debug + Copy>(
    errors: &mut Errors,
    field: impl Into<String>,
    value: Option<T>,
) {
    if let Some(v) = value.filter(|v| !(0.0..=100.0).contains(&(*v).into())) {
        errors.add(field, invalid(v, "must be between 0 and 100"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_use_kubernetes_words() {
        assert_eq!(required("x"), "Required value: x");
        assert_eq!(invalid(150, "too big"), "Invalid value: 150: too big");
        assert_eq!(invalid("a", "bad"), "Invalid value: \"a\": bad");
        assert_eq!(duplicate("a", "again"), "Duplicate value: \"a\": again");
        assert_eq!(forbidden("no"), "Forbidden: no");
        assert_eq!(unsupported("X", &["A", "B"]), "Unsupported value: \"X\": supported values: \"A\", \"B\"");
    }

    #[test]
    fn negative_counts_and_out_of_range_percentages_are_reported() {
        let mut errors = Errors::default();
        check_non_negative(&mut errors, "a", Some(-1));
        check_non_negative(&mut errors, "b", Some(0));
        check_percent_range(&mut errors, "c", Some(100.5));
        check_percent_range(&mut errors, "d", Some(100.0));
        let fields: Vec<&str> = errors.found.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["a", "c"]);
    }
}
