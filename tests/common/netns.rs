//! A network namespace the test makes, reachable from the host through a veth pair: pod
//! addresses for tests against a real API server, which refuses loopback addresses in
//! EndpointSlices. Listeners are opened inside it by a thread that enters it; the namespace and
//! its veth pair are deleted on drop.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace holding addresses `10.213.N.2` and up, routed from the host via `10.213.N.1`.
pub struct NetNs {
    name: String,
    host_if: String,
    subnet: u8,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl NetNs {
    /// Makes a namespace with `count` addresses. `None` (the test skips, saying why) where this
    /// process may not make namespaces, except in CI, where that is a failure.
    pub fn create(count: u8) -> Option<NetNs> {
        // A subnet per namespace, distinct across the test processes of one run.
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let subnet = ((std::process::id() + n * 37) % 200 + 20) as u8;
        let name = format!("mp-{}-{n}", std::process::id());
        let host_if = format!("mph{subnet}x{n}");
        let ns_if = format!("mpn{subnet}x{n}");
        let made = (|| {
            ip(&["netns", "add", &name])?;
            ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if])?;
            ip(&["link", "set", &ns_if, "netns", &name])?;
            ip(&["addr", "add", &format!("10.213.{subnet}.1/24"), "dev", &host_if])?;
            ip(&["link", "set", &host_if, "up"])?;
            for i in 0..count {
                ip(&["-n", &name, "addr", "add", &format!("10.213.{subnet}.{}/24", i + 2), "dev", &ns_if])?;
            }
            ip(&["-n", &name, "link", "set", &ns_if, "up"])?;
            ip(&["-n", &name, "link", "set", "lo", "up"])
        })();
        let ns = NetNs { name, host_if, subnet };
        match made {
            Ok(()) => Some(ns),
            Err(e) => {
                drop(ns);
                let why = format!("cannot make a network namespace ({e}); run as root");
                assert!(std::env::var("CI").as_deref() != Ok("true"), "{why} (CI=true: this test must run)");
                eprintln!("SKIPPED: {why}");
                None
            }
        }
    }

    /// The `i`-th address (from 0) inside the namespace.
    pub fn addr(&self, i: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, i + 2)
    }

    /// A listener on `addr` inside the namespace (opened by a thread that enters it; the socket
    /// stays in the namespace).
    pub fn listen(&self, addr: SocketAddr) -> TcpListener {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
            // SAFETY: setns on this thread only, with a valid namespace file descriptor.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {path}: {e}"))
        })
        .join()
        .expect("the thread binding in the namespace")
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}
