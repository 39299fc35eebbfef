//! The few fields the client needs, read straight from the protobuf wire format without copying:
//! a response's envelope (type, version, nonce, the resources' bytes) and a resource's name.
//! Decoding a `DiscoveryResponse` with prost would copy every resource and allocate per resource,
//! for each of thousands of proxies receiving the same bytes.

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf: {0}")]
pub struct WireError(&'static str);

/// One field's payload.
enum Payload<'a> {
    Scalar,
    Bytes(&'a [u8]),
}

/// The top-level fields of a message, in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Payload<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        Some(self.field())
    }
}

impl<'a> Fields<'a> {
    fn field(&mut self) -> Result<(u64, Payload<'a>), WireError> {
        let key = varint(&mut self.0)?;
        let skip = |bytes: &mut &'a [u8], n: usize| -> Result<&'a [u8], WireError> {
            let (value, rest) = (bytes.get(..n).ok_or(WireError("truncated field"))?, &bytes[n..]);
            *bytes = rest;
            Ok(value)
        };
        let payload = match key & 7 {
            0 => {
                varint(&mut self.0)?;
                Payload::Scalar
            }
            1 => {
                skip(&mut self.0, 8)?;
                Payload::Scalar
            }
            2 => {
                let len = usize::try_from(varint(&mut self.0)?).map_err(|_| WireError("length overflows"))?;
                Payload::Bytes(skip(&mut self.0, len)?)
            }
            5 => {
                skip(&mut self.0, 4)?;
                Payload::Scalar
            }
            _ => return Err(WireError("unsupported wire type")),
        };
        Ok((key >> 3, payload))
    }
}

fn varint(bytes: &mut &[u8]) -> Result<u64, WireError> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&b, rest) = bytes.split_first().ok_or(WireError("truncated varint"))?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(WireError("varint too long"))
}

fn text(bytes: &[u8]) -> Result<&str, WireError> {
    std::str::from_utf8(bytes).map_err(|_| WireError("string is not UTF-8"))
}

/// The last occurrence of length-delimited field `field` (protobuf's rule for singular fields).
fn last_bytes(bytes: &[u8], field: u64) -> Result<Option<&[u8]>, WireError> {
    let mut found = None;
    for f in Fields(bytes) {
        if let (n, Payload::Bytes(b)) = f? {
            if n == field {
                found = Some(b);
            }
        }
    }
    Ok(found)
}

/// String field `field` of a message (empty when absent), e.g. the name (field 1) of a
/// ClusterLoadAssignment or RouteConfiguration, whose bodies are never decoded.
pub fn string_field(bytes: &[u8], field: u64) -> Result<&str, WireError> {
    last_bytes(bytes, field)?.map_or(Ok(""), text)
}

/// A state-of-the-world `DiscoveryResponse`, borrowed from its bytes.
#[derive(Debug, Default, PartialEq)]
pub struct SotwResponse<'a> {
    /// `version_info` (1).
    pub version_info: &'a str,
    /// `type_url` (4).
    pub type_url: &'a str,
    /// `nonce` (5).
    pub nonce: &'a str,
    /// The `value` of each `Any` of `resources` (2).
    pub resources: Vec<&'a [u8]>,
}

/// Reads a `DiscoveryResponse`.
pub fn sotw(bytes: &[u8]) -> Result<SotwResponse<'_>, WireError> {
    let mut r = SotwResponse::default();
    for f in Fields(bytes) {
        let (n, Payload::Bytes(b)) = f? else { continue };
        match n {
            1 => r.version_info = text(b)?,
            2 => r.resources.push(last_bytes(b, 2)?.unwrap_or_default()),
            4 => r.type_url = text(b)?,
            5 => r.nonce = text(b)?,
            _ => {}
        }
    }
    Ok(r)
}

/// A `DeltaDiscoveryResponse`, borrowed from its bytes.
#[derive(Debug, Default, PartialEq)]
pub struct DeltaResponse<'a> {
    /// `type_url` (4).
    pub type_url: &'a str,
    /// `nonce` (5).
    pub nonce: &'a str,
    /// Each `Resource` (2): its `name` (3) and its `resource` Any's `value` (2.2).
    pub resources: Vec<(&'a str, &'a [u8])>,
    /// `removed_resources` (6) and the names of `removed_resource_names` (8.1).
    pub removed: Vec<&'a str>,
}

/// Reads a `DeltaDiscoveryResponse`.
pub fn delta(bytes: &[u8]) -> Result<DeltaResponse<'_>, WireError> {
    let mut r = DeltaResponse::default();
    for f in Fields(bytes) {
        let (n, Payload::Bytes(b)) = f? else { continue };
        match n {
            2 => {
                let value = match last_bytes(b, 2)? {
                    Some(any) => last_bytes(any, 2)?.unwrap_or_default(),
                    None => &[],
                };
                r.resources.push((string_field(b, 3)?, value));
            }
            4 => r.type_url = text(b)?,
            5 => r.nonce = text(b)?,
            6 => r.removed.push(text(b)?),
            8 => r.removed.push(string_field(b, 1)?),
            _ => {}
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, Resource, ResourceName,
    };
    use envoy_types::pb::google::protobuf::Any;
    use prost::Message;

    fn any(value: &[u8]) -> Any {
        Any { type_url: "t".into(), value: value.to_vec() }
    }

    #[test]
    fn reads_a_sotw_response_as_prost_wrote_it() {
        let resp = DiscoveryResponse {
            version_info: "v1".into(),
            resources: vec![any(b"one"), any(b""), any(b"three")],
            type_url: "type.googleapis.com/x".into(),
            nonce: "n7".into(),
            canary: true,
            ..Default::default()
        };
        let bytes = resp.encode_to_vec();
        let r = sotw(&bytes).expect("valid");
        assert_eq!((r.version_info, r.type_url, r.nonce), ("v1", "type.googleapis.com/x", "n7"));
        assert_eq!(r.resources, vec![&b"one"[..], &b""[..], &b"three"[..]]);
    }

    #[test]
    fn reads_a_delta_response_as_prost_wrote_it() {
        let resp = DeltaDiscoveryResponse {
            system_version_info: "s".into(),
            resources: vec![
                Resource { name: "a".into(), version: "1".into(), resource: Some(any(b"body")), ..Default::default() },
                Resource { name: "b".into(), ..Default::default() },
            ],
            type_url: "t".into(),
            removed_resources: vec!["gone".into()],
            removed_resource_names: vec![ResourceName { name: "gone2".into(), ..Default::default() }],
            nonce: "9".into(),
            ..Default::default()
        };
        let bytes = resp.encode_to_vec();
        let r = delta(&bytes).expect("valid");
        assert_eq!((r.type_url, r.nonce), ("t", "9"));
        assert_eq!(r.resources, vec![("a", &b"body"[..]), ("b", &b""[..])]);
        assert_eq!(r.removed, vec!["gone", "gone2"]);
    }

    #[test]
    fn reads_a_name_and_refuses_broken_bytes() {
        let cla = ClusterLoadAssignment { cluster_name: "outbound|80||a".into(), ..Default::default() };
        assert_eq!(string_field(&cla.encode_to_vec(), 1), Ok("outbound|80||a"));
        assert_eq!(string_field(&[0x08, 0x96, 0x01], 1), Ok(""));
        assert!(string_field(&[0x0a, 0x05, b'a'], 1).is_err(), "truncated");
        assert!(sotw(&[0x0b]).is_err(), "wire type 3");
        assert!(sotw(&[0x80]).is_err(), "truncated varint");
    }
}
