//! A resource's delta `version`: its content hash in hex, so identical resources have identical
//! versions on every frontend and across reconnects.

/// The hash standing for a version the proxy sent that is not one of ours: matches nothing
/// real (save a 2^-64 chance), so that resource is sent again.
pub(super) const FOREIGN_VERSION: u64 = u64::MAX;

/// The delta `version` of a resource with content hash `hash`.
pub fn resource_version(hash: u64) -> String {
    format!("{hash:016x}")
}

/// The content hash a delta `version` stands for.
pub fn parse_version(version: &str) -> u64 {
    match u64::from_str_radix(version, 16) {
        Ok(hash) if version.len() == 16 => hash,
        _ => FOREIGN_VERSION,
    }
}
