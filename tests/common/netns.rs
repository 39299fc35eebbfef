//! A network namespace the test makes, reachable from the host through a veth pair: pod
//! addresses for tests against a real API server, which refuses loopback addresses in
//! EndpointSlices, and pods with a sidecar (`common::sidecar`). Sockets are opened inside it by
//! a thread that enters it (they stay in the namespace); a [`Forward`] lets host clients dial
//! from inside. Processes left in it are killed, and the namespace and its veth pairs deleted,
//! on drop.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::ports::free_port;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace holding addresses `10.213.N.2` and up, routed from the host via `10.213.N.1`
/// (also its default route).
pub struct NetNs {
    name: String,
    host_if: String,
    subnet: u8,
    /// Host-side ends of veth pairs to other namespaces ([`NetNs::link`]), deleted on drop.
    links: std::sync::Mutex<Vec<(String, String)>>,
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
        let first = (std::process::id() + n * 37) % 200;
        // Skip subnets an interface on the host already uses (another test process's namespace).
        let in_use = |subnet: u32| {
            Command::new("ip")
                .args(["-o", "-4", "addr", "show", "to", &format!("10.213.{subnet}.0/24")])
                .output()
                .is_ok_and(|o| !o.stdout.is_empty())
        };
        let subnet = (0..200).map(|i| (first + i) % 200 + 20).find(|s| !in_use(*s)).unwrap_or(first + 20) as u8;
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
            ip(&["-n", &name, "link", "set", "lo", "up"])?;
            // Connections to addresses nowhere else (a Service's cluster IP) need a route before
            // iptables can redirect them to a sidecar. Without an address of its own (a namespace
            // made only for its host end's address) nothing inside dials out, and the kernel
            // refuses a gateway no address of the namespace is on the subnet of.
            if count == 0 {
                return Ok(());
            }
            ip(&["-n", &name, "route", "add", "default", "via", &format!("10.213.{subnet}.1")])
        })();
        let ns = NetNs { name, host_if, subnet, links: Default::default() };
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

    /// Its name, for `ip netns exec NAME ...`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's end of the veth pair (`10.213.N.1`): servers the host runs there are reachable
    /// from inside.
    pub fn host_addr(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 213, self.subnet, 1)
    }

    /// Runs `f` on a new thread that entered the namespace (and ends with `f`); sockets it opens
    /// stay in the namespace.
    pub fn run_in<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        run_in(self.path(), f)
    }

    fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// A listener on `addr` inside the namespace.
    pub fn listen(&self, addr: SocketAddr) -> TcpListener {
        let path = self.path();
        self.run_in(move || TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr} in {path}: {e}")))
    }

    /// A TCP connection to `addr` made from inside the namespace (as this process's uid).
    pub fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.run_in(move || TcpStream::connect_timeout(&addr, Duration::from_secs(5)))
    }

    /// A relay on 127.0.0.1 of the host whose every connection is dialed to `target` from inside
    /// the namespace: host clients (reqwest, the Envoy admin helpers) then act as a client in the
    /// namespace. Runs on the current Tokio runtime; stops when dropped.
    pub async fn forward(&self, target: SocketAddr) -> Forward {
        let listener =
            tokio::net::TcpListener::bind(("127.0.0.1", free_port())).await.expect("binding a forward listener");
        let port = listener.local_addr().expect("forward address").port();
        let path = self.path();
        let task = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let path = path.clone();
                tokio::spawn(async move {
                    let dial =
                        move || run_in(path, move || TcpStream::connect_timeout(&target, Duration::from_secs(5)));
                    let Ok(Ok(upstream)) = tokio::task::spawn_blocking(dial).await else { return };
                    if upstream.set_nonblocking(true).is_err() {
                        return;
                    }
                    let Ok(mut upstream) = tokio::net::TcpStream::from_std(upstream) else { return };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                });
            }
        });
        Forward { port, target, task }
    }

    /// Links this namespace directly to `other` with a veth pair and routes each one's subnet to
    /// the other over it, so their addresses reach each other without the host forwarding.
    pub fn link(&self, other: &NetNs) {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let (a, b) = (format!("mpl{}x{n}a", self.subnet), format!("mpl{}x{n}b", other.subnet));
        let made = (|| {
            ip(&["link", "add", &a, "netns", &self.name, "type", "veth", "peer", "name", &b, "netns", &other.name])?;
            // Each end carries its namespace's first address once more: iptables' REDIRECT of a
            // connection arriving over the link rewrites it to the link's address (and drops it
            // without one), and a new address would be one more pod IP to pilot-agent.
            ip(&["-n", &self.name, "addr", "add", &format!("{}/32", self.addr(0)), "dev", &a])?;
            ip(&["-n", &other.name, "addr", "add", &format!("{}/32", other.addr(0)), "dev", &b])?;
            ip(&["-n", &self.name, "link", "set", &a, "up"])?;
            ip(&["-n", &other.name, "link", "set", &b, "up"])?;
            let src = self.addr(0).to_string();
            ip(&["-n", &self.name, "route", "add", &format!("10.213.{}.0/24", other.subnet), "dev", &a, "src", &src])?;
            let src = other.addr(0).to_string();
            ip(&["-n", &other.name, "route", "add", &format!("10.213.{}.0/24", self.subnet), "dev", &b, "src", &src])
        })();
        self.links.lock().unwrap_or_else(|e| e.into_inner()).push((self.name.clone(), a));
        made.unwrap_or_else(|e| panic!("linking namespaces {} and {}: {e}", self.name, other.name));
    }

    /// Process ids of the processes in the namespace (`ip netns pids`), this test process excluded.
    pub fn pids(&self) -> Vec<u32> {
        let out = Command::new("ip").args(["netns", "pids", &self.name]).output();
        let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
        text.split_whitespace().filter_map(|p| p.parse().ok()).filter(|p| *p != std::process::id()).collect()
    }

    /// Kills (`-9`) the processes left in the namespace (children that outlived the process the
    /// test started, such as the Envoy a killed pilot-agent started) and waits until none is left.
    pub fn kill_processes(&self) {
        for _ in 0..50 {
            let pids = self.pids();
            if pids.is_empty() {
                return;
            }
            for pid in pids {
                let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("processes still in namespace {}: {:?}", self.name, self.pids());
    }
}

/// Runs `f` on a new thread that entered the namespace at `path`.
fn run_in<T: Send + 'static>(path: String, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: setns on this thread only (which ends with `f`), with a valid namespace fd.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// A relay from `127.0.0.1:port` on the host to a target dialed inside a namespace; see
/// [`NetNs::forward`].
pub struct Forward {
    port: u16,
    target: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Forward {
    /// The host port (on 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }
    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
    /// What it dials inside the namespace.
    pub fn target(&self) -> SocketAddr {
        self.target
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        self.kill_processes();
        for (ns, link) in self.links.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = ip(&["-n", &ns, "link", "del", &link]);
        }
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}
