//! A stub DNS server: one name, fixed A records in a fixed order (for an Envoy resolving a
//! headless Service's name to several test backends).

use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A DNS server on 127.0.0.1 (UDP) answering A queries for one name with fixed addresses in a
/// fixed order; other names get NXDOMAIN, other types for the name no records. Stops when dropped.
pub struct StubDns {
    /// The UDP port it answers on (127.0.0.1).
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StubDns {
    /// Answers A queries for `name` with `addrs`, in that order.
    pub fn start(name: &str, addrs: Vec<Ipv4Addr>) -> StubDns {
        let socket = UdpSocket::bind(super::ports::free_addr()).expect("bind the stub DNS socket");
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("set the stub DNS read timeout");
        let port = socket.local_addr().expect("stub DNS address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let name = name.to_ascii_lowercase();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    let Ok((len, peer)) = socket.recv_from(&mut buf) else { continue };
                    if let Some(reply) = dns_reply(&buf[..len], &name, &addrs) {
                        let _ = socket.send_to(&reply, peer);
                    }
                }
            }
        });
        StubDns { port, stop, thread: Some(thread) }
    }
}

impl Drop for StubDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The answer to DNS `query` (RFC 1035 wire format), or None if it is not a query we can read.
fn dns_reply(query: &[u8], name: &str, addrs: &[Ipv4Addr]) -> Option<Vec<u8>> {
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question = query.get(12..at + 4)?;
    let known = labels.join(".") == name;
    let answers: &[Ipv4Addr] = if known && qtype == 1 { addrs } else { &[] };
    let mut reply = query[..2].to_vec(); // id
    reply.push(0x84 | (query[2] & 0x01)); // response, authoritative, recursion desired as asked
    reply.push(if known { 0x80 } else { 0x83 }); // recursion available; NOERROR or NXDOMAIN
    reply.extend_from_slice(&[0, 1]);
    reply.extend_from_slice(&u16::try_from(answers.len()).ok()?.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(question);
    for addr in answers {
        reply.extend_from_slice(&[0xC0, 12, 0, 1, 0, 1]); // name (pointer to the question), A, IN
        reply.extend_from_slice(&5u32.to_be_bytes()); // TTL
        reply.extend_from_slice(&[0, 4]);
        reply.extend_from_slice(&addr.octets());
    }
    Some(reply)
}
