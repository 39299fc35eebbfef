//! The one test port allocator: every server a test starts takes its port from here.
//!
//! Ports come from outside the kernel's ephemeral range (`ip_local_port_range`, 32768-60999 by
//! default, so 20000-32767 then): a port picked from that range can be taken by any outgoing
//! connection (hundreds in the scale tests) before the process meant to listen on it binds.
//! A listener the test itself holds binds port 0 instead ([`bind_local`]).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Mutex, OnceLock};

/// A port that was free a moment ago for TCP on every address (0.0.0.0 and 127.0.0.1) and for UDP.
/// Never returns the same port twice within one test process.
pub fn free_port() -> u16 {
    let (low, span) = non_ephemeral_range();
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(|| Mutex::new(HashSet::new()));
    // Start each test process at a different place so parallel test binaries rarely collide.
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    for i in 0..span {
        let port = u16::try_from(low + (seed.wrapping_add(i.wrapping_mul(7_919))) % span).expect("port in range");
        let free = TcpListener::bind(("0.0.0.0", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok();
        if free && handed_out.lock().unwrap_or_else(|e| e.into_inner()).insert(port) {
            return port;
        }
    }
    panic!("no free port in {low}-{}", low + span - 1);
}

/// The widest run of ports (first, length) outside the kernel's ephemeral range, and not below
/// 20000 (Istio's fixed 150xx ports, other services); 20000-32767 when the range cannot be read.
fn non_ephemeral_range() -> (u32, u32) {
    const FLOOR: u32 = 20_000;
    let configured = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok().and_then(|text| {
        let mut bounds = text.split_whitespace().filter_map(|n| n.parse::<u32>().ok());
        Some((bounds.next()?, bounds.next()?))
    });
    let Some((eph_low, eph_high)) = configured else { return (20_000, 12_768) };
    let below = (FLOOR, eph_low.saturating_sub(FLOOR));
    let above = (eph_high + 1, 65_536u32.saturating_sub(eph_high + 1));
    let widest = if below.1 >= above.1 { below } else { above };
    if widest.1 < 1_000 {
        // The ephemeral range covers nearly everything: nothing is safe, so take the default.
        return (20_000, 12_768);
    }
    widest
}

/// A listener on 127.0.0.1 at a port the kernel picks: no window in which another process
/// can take it.
pub async fn bind_local() -> tokio::net::TcpListener {
    match tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await {
        Ok(listener) => listener,
        Err(e) => panic!("binding 127.0.0.1:0: {e}"),
    }
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
