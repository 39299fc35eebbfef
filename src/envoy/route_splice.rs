//! Replacing the routes of named virtual hosts inside an encoded RouteConfiguration, without
//! decoding the rest: a route configuration of a thousand-service mesh holds ~150 virtual hosts,
//! of which a VirtualService edit touches one or two.
//!
//! The output is byte for byte what encoding the changed configuration gives, because prost
//! writes fields in field-number order and a repeated field as one run: the new routes take the
//! place of the old run.

use std::collections::HashMap;

use bytes::Buf;
use envoy_types::pb::envoy::config::route::v3::Route;
use prost::encoding::{decode_key, decode_varint, encode_key, encode_varint, WireType};

/// `RouteConfiguration.virtual_hosts`.
const VIRTUAL_HOSTS: u32 = 2;
/// `VirtualHost.name`.
const NAME: u32 = 1;
/// `VirtualHost.routes`.
const ROUTES: u32 = 3;

/// Why an encoded route configuration could not be patched (then it is generated whole).
#[derive(Debug, thiserror::Error, PartialEq)]
pub(super) enum SpliceError {
    /// The bytes are not a well-formed message of the expected shape.
    #[error("malformed route configuration")]
    Malformed,
    /// A virtual host to patch is not in the configuration.
    #[error("no virtual host named {0:?}")]
    Missing(String),
}

/// `config` (an encoded RouteConfiguration) with the routes of each virtual host named in
/// `routes` replaced by the given ones.
pub(super) fn replace_routes(config: &[u8], routes: &HashMap<String, Vec<Route>>) -> Result<Vec<u8>, SpliceError> {
    let mut out = Vec::with_capacity(config.len() + 256);
    let mut patched = std::collections::HashSet::new();
    for field in Fields(config) {
        let field = field?;
        let host = match field.number {
            VIRTUAL_HOSTS => field.payload.and_then(|vh| name(vh).transpose()).transpose()?,
            _ => None,
        };
        match host.and_then(|name| routes.get_key_value(name)) {
            Some((name, new_routes)) => {
                let vh = with_routes(field.payload.ok_or(SpliceError::Malformed)?, new_routes)?;
                encode_key(VIRTUAL_HOSTS, WireType::LengthDelimited, &mut out);
                encode_varint(vh.len() as u64, &mut out);
                out.extend_from_slice(&vh);
                patched.insert(name);
            }
            None => out.extend_from_slice(field.raw),
        }
    }
    if let Some(missing) = routes.keys().find(|n| !patched.contains(n)) {
        return Err(SpliceError::Missing(missing.clone()));
    }
    Ok(out)
}

/// The name of an encoded virtual host.
fn name(vh: &[u8]) -> Result<Option<&str>, SpliceError> {
    for field in Fields(vh) {
        let field = field?;
        if field.number == NAME {
            let bytes = field.payload.ok_or(SpliceError::Malformed)?;
            return std::str::from_utf8(bytes).map(Some).map_err(|_| SpliceError::Malformed);
        }
    }
    Ok(None)
}

/// An encoded virtual host with its routes replaced: the new run goes where the old one was.
fn with_routes(vh: &[u8], routes: &[Route]) -> Result<Vec<u8>, SpliceError> {
    let mut out = Vec::with_capacity(vh.len() + 128);
    let mut written = false;
    let write_routes = |out: &mut Vec<u8>| {
        for route in routes {
            prost::encoding::message::encode(ROUTES, route, out);
        }
    };
    for field in Fields(vh) {
        let field = field?;
        if field.number >= ROUTES && !written {
            write_routes(&mut out);
            written = true;
        }
        if field.number != ROUTES {
            out.extend_from_slice(field.raw);
        }
    }
    if !written {
        write_routes(&mut out);
    }
    Ok(out)
}

/// One field of an encoded message: its number, its bytes as encoded (key included), and the
/// payload of a length-delimited field.
struct Field<'a> {
    number: u32,
    raw: &'a [u8],
    payload: Option<&'a [u8]>,
}

/// The fields of an encoded message, in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Iterator for Fields<'a> {
    type Item = Result<Field<'a>, SpliceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = next_field(self.0);
        match &field {
            Ok((_, rest)) => self.0 = rest,
            // Stop after the first error.
            Err(_) => self.0 = &[],
        }
        Some(field.map(|(f, _)| f))
    }
}

/// Splits the first field off `bytes`.
fn next_field(bytes: &[u8]) -> Result<(Field<'_>, &[u8]), SpliceError> {
    let mut buf = bytes;
    let (number, wire_type) = decode_key(&mut buf).map_err(|_| SpliceError::Malformed)?;
    let (skip, payload_len) = match wire_type {
        WireType::Varint => {
            let mut value = buf;
            decode_varint(&mut value).map_err(|_| SpliceError::Malformed)?;
            (buf.len() - value.len(), None)
        }
        WireType::SixtyFourBit => (8, None),
        WireType::ThirtyTwoBit => (4, None),
        WireType::LengthDelimited => {
            let len = usize::try_from(decode_varint(&mut buf).map_err(|_| SpliceError::Malformed)?)
                .map_err(|_| SpliceError::Malformed)?;
            (len, Some(len))
        }
        WireType::StartGroup | WireType::EndGroup => return Err(SpliceError::Malformed),
    };
    if buf.remaining() < skip {
        return Err(SpliceError::Malformed);
    }
    let header = bytes.len() - buf.len();
    let payload = payload_len.map(|len| &buf[..len]);
    let (raw, rest) = bytes.split_at(header + skip);
    Ok((Field { number, raw, payload }, rest))
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
    use prost::Message;

    use super::*;

    fn route(name: &str) -> Route {
        Route { name: name.into(), ..Default::default() }
    }

    fn vhost(name: &str, routes: &[&str]) -> VirtualHost {
        VirtualHost {
            name: name.into(),
            domains: vec![format!("{name}.example"), format!("{name}.example:80")],
            routes: routes.iter().map(|r| route(r)).collect(),
            include_request_attempt_count: true,
            ..Default::default()
        }
    }

    fn config(hosts: Vec<VirtualHost>) -> RouteConfiguration {
        RouteConfiguration {
            name: "80".into(),
            virtual_hosts: hosts,
            ignore_port_in_host_matching: true,
            ..Default::default()
        }
    }

    #[test]
    fn patching_gives_the_bytes_of_the_patched_configuration() {
        let before = config(vec![vhost("a", &["default"]), vhost("b", &["x", "y"]), vhost("c", &["default"])]);
        let patches = HashMap::from([
            ("b".to_string(), vec![route("z")]),
            ("c".to_string(), vec![route("p"), route("q"), route("r")]),
        ]);
        let got = replace_routes(&before.encode_to_vec(), &patches).expect("patched");
        let mut want = before.clone();
        want.virtual_hosts[1].routes = vec![route("z")];
        want.virtual_hosts[2].routes = ["p", "q", "r"].iter().map(|r| route(r)).collect();
        assert_eq!(got, want.encode_to_vec());
        assert_eq!(RouteConfiguration::decode(got.as_slice()).expect("decodes"), want);
    }

    #[test]
    fn a_virtual_host_without_routes_gets_them_in_field_order() {
        let before = config(vec![vhost("a", &[])]);
        let patches = HashMap::from([("a".to_string(), vec![route("r")])]);
        let got = replace_routes(&before.encode_to_vec(), &patches).expect("patched");
        let mut want = before;
        want.virtual_hosts[0].routes = vec![route("r")];
        assert_eq!(got, want.encode_to_vec());
    }

    #[test]
    fn a_missing_host_or_malformed_bytes_are_refused() {
        let before = config(vec![vhost("a", &["default"])]).encode_to_vec();
        let patches = HashMap::from([("nope".to_string(), vec![route("r")])]);
        assert_eq!(replace_routes(&before, &patches), Err(SpliceError::Missing("nope".into())));
        let patches = HashMap::from([("a".to_string(), vec![route("r")])]);
        // The last 2 bytes are the last field (a bool): a cut before it leaves a valid message.
        for cut in 1..before.len() - 2 {
            // Truncated anywhere before: an error, never a panic or a silently shorter config.
            if let Ok(out) = replace_routes(&before[..cut], &patches) {
                panic!("cut at {cut} gave {out:?}");
            }
        }
    }
}
