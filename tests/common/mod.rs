//! Test harness shared by every integration test binary (declare `mod common;` at its root).
#![allow(dead_code)]

pub mod ports;
