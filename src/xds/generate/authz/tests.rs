//! Tests of the generated security filters.
