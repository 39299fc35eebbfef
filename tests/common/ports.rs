//! The one test port allocator: every server a test starts takes its port from here.
//!
//! Ports come from 20000-32767, below Linux's ephemeral range (32768-60999): a port picked
//! from that range can be taken by any outgoing connection (hundreds in the scale tests)
//! before the process meant to listen on it binds.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Mutex, OnceLock};

/// A port that was free a moment ago for TCP on every address (0.0.0.0 and 127.0.0.1) and for UDP.
/// Never returns the same port twice within one test process.
pub fn free_port() -> u16 {
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_768;
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(|| Mutex::new(HashSet::new()));
    // Start each test process at a different place so parallel test binaries rarely collide.
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    for i in 0..SPAN {
        let port = u16::try_from(LOW + (seed.wrapping_add(i.wrapping_mul(7_919))) % SPAN).expect("port in range");
        let free = TcpListener::bind(("0.0.0.0", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free && handed_out.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
    panic!("no free port in 20000-32767");
}

/// `127.0.0.1:<free_port()>`.
pub fn free_addr() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), free_port())
}

/// A port from [`free_port`] that is also free on every one of `ips` (other loopback addresses).
pub fn port_free_on(ips: &[Ipv4Addr]) -> u16 {
    for _ in 0..100 {
        let port = free_port();
        if ips.iter().all(|ip| TcpListener::bind((*ip, port)).is_ok()) {
            return port;
        }
    }
    panic!("no port free on all of {ips:?}")
}
