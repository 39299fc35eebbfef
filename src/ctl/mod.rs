//! Operator tools: `meshpilot proxy-status` and `meshpilot proxy-config`, clients of a node's
//! admin endpoints and, for the other frontends of a split deployment, of their xDS debug types.

pub mod admin_client;
pub mod config_diff;
pub mod config_tables;
pub mod proxy_config;
pub mod proxy_status;
mod tables;
pub mod xds_client;

/// Why an operator command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The admin endpoint could not be reached or answered nonsense.
    #[error("{url}: {why}")]
    Admin {
        /// The URL asked.
        url: String,
        /// What went wrong.
        why: String,
    },
    /// A frontend's xDS debug answer could not be had.
    #[error("xDS debug request to {addr}: {why}")]
    Xds {
        /// The frontend's xDS address.
        addr: String,
        /// What went wrong.
        why: String,
    },
    /// No node knows the proxy.
    #[error("proxy {0} is not connected to any frontend reached (give its node id or pod.namespace)")]
    UnknownProxy(String),
    /// An argument is unusable.
    #[error("{0}")]
    Argument(String),
}
