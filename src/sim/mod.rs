//! Simulated proxies: ADS clients that behave like Envoy (subscribe, follow EDS/RDS names, ACK),
//! for load generation and tests; and the replay server, which writes captured responses back.

pub mod capture;
mod client;
pub mod load;
pub mod replay;

pub use client::{HeldResource, SimError, SimProxy, SimProxySpec, SimState, TypeState};
