//! Simulated proxies: ADS clients that behave like Envoy (subscribe, follow EDS/RDS names, ACK),
//! for load generation and tests.

mod client;
pub mod load;

pub use client::{SimError, SimProxy, SimProxySpec, SimState, TypeState};
