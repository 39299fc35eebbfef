//! Who may hold a TLS listener's handshake capacity, and for how long.
//!
//! A connection first waits for its first bytes (a ClientHello starts at once in any real
//! client) without a handshake slot: idle sockets cost a task and a descriptor, and when their
//! number passes a bound the oldest idle one is closed, so a flood of idle sockets cannot keep a
//! new caller out. Only a connection that sent something takes one of the handshake slots; one
//! address holds only a few of them at once, and a share of them is kept for peers that completed
//! a handshake recently (the API server, meshpilot's frontends), so that a flood from addresses
//! never seen before cannot take them all.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};

/// Limits of one listener's connections before their TLS session is established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeLimits {
    /// A connection must send its first bytes within this.
    pub first_bytes: Duration,
    /// The whole handshake, from accept, must finish within this.
    pub handshake: Duration,
    /// Connections waiting for their first bytes; beyond it the oldest waiter is closed.
    pub waiting: usize,
    /// Connections of one address waiting for their first bytes; beyond it its oldest is closed.
    pub waiting_per_ip: usize,
    /// Handshakes in progress at once.
    pub handshakes: usize,
    /// Of those, slots only peers that completed a handshake recently may take.
    pub reserved: usize,
    /// Handshakes in progress of one address; a connection beyond it is closed.
    pub handshakes_per_ip: usize,
    /// How long a peer that completed a handshake counts as known.
    pub known_for: Duration,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            first_bytes: Duration::from_secs(2),
            handshake: Duration::from_secs(5),
            waiting: 8192,
            waiting_per_ip: 256,
            handshakes: 1024,
            reserved: 256,
            handshakes_per_ip: 64,
            known_for: Duration::from_secs(600),
        }
    }
}

/// Most addresses remembered as known peers (bounds the memory of a flood of completed handshakes).
const MAX_KNOWN: usize = 4096;

/// Why a connection was closed before its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// It sent nothing within the deadline.
    Idle,
    /// It closed before sending anything.
    Closed,
    /// It was the oldest idle connection when a newer one needed room.
    Evicted,
    /// Its address has too many handshakes in progress.
    PerIp,
    /// No handshake slot freed within its deadline.
    Busy,
}

/// The handshake capacity of one listener, shared by its connections' tasks.
#[derive(Debug, Clone)]
pub struct HandshakeGate {
    limits: HandshakeLimits,
    state: Arc<Mutex<State>>,
    open: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Connections waiting for their first bytes, oldest first, with what closes them.
    waiting: BTreeMap<u64, (IpAddr, oneshot::Sender<()>)>,
    waiting_by_ip: HashMap<IpAddr, usize>,
    handshaking_by_ip: HashMap<IpAddr, usize>,
    known: HashMap<IpAddr, Instant>,
}

/// A connection's place among those waiting for first bytes; leaves it when dropped.
struct Waiting {
    id: u64,
    ip: IpAddr,
    state: Arc<Mutex<State>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        if state.waiting.remove(&self.id).is_some() {
            decrement(&mut state.waiting_by_ip, self.ip);
        }
    }
}

/// A handshake slot, held until the handshake ended.
#[derive(Debug)]
pub struct HandshakeSlot {
    _permit: OwnedSemaphorePermit,
    ip: IpAddr,
    state: Arc<Mutex<State>>,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        decrement(&mut lock(&self.state).handshaking_by_ip, self.ip);
    }
}

impl HandshakeGate {
    /// A gate with `limits`.
    pub fn new(limits: HandshakeLimits) -> HandshakeGate {
        let reserved = limits.reserved.min(limits.handshakes);
        HandshakeGate {
            limits,
            state: Arc::default(),
            open: Arc::new(Semaphore::new(limits.handshakes - reserved)),
            reserved: Arc::new(Semaphore::new(reserved)),
        }
    }

    /// The limits.
    pub fn limits(&self) -> HandshakeLimits {
        self.limits
    }

    /// Waits until `tcp` sent its first bytes, then for a handshake slot; the whole within the
    /// handshake deadline from `accepted` (the caller bounds the handshake itself by the rest).
    pub async fn admit(&self, tcp: &TcpStream, ip: IpAddr, accepted: Instant) -> Result<HandshakeSlot, Refused> {
        self.first_bytes(tcp, ip).await?;
        let deadline = tokio::time::Instant::from_std(accepted + self.limits.handshake);
        {
            let mut state = lock(&self.state);
            let in_progress = state.handshaking_by_ip.entry(ip).or_default();
            if *in_progress >= self.limits.handshakes_per_ip {
                return Err(Refused::PerIp);
            }
            *in_progress += 1;
        }
        // Counted above, so the slot's drop (or this guard's, on refusal) takes it back.
        let counted = Counted { ip, state: self.state.clone() };
        let permit = match self.open.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) if self.is_known(ip) => {
                let either = async {
                    tokio::select! {
                        p = self.open.clone().acquire_owned() => p,
                        p = self.reserved.clone().acquire_owned() => p,
                    }
                };
                match tokio::time::timeout_at(deadline, either).await {
                    Ok(Ok(p)) => p,
                    _ => return Err(Refused::Busy),
                }
            }
            Err(_) => match tokio::time::timeout_at(deadline, self.open.clone().acquire_owned()).await {
                Ok(Ok(p)) => p,
                _ => return Err(Refused::Busy),
            },
        };
        std::mem::forget(counted);
        Ok(HandshakeSlot { _permit: permit, ip, state: self.state.clone() })
    }

    /// Records that `ip` completed a handshake: it may use the reserved slots for a while.
    pub fn completed(&self, ip: IpAddr) {
        let now = Instant::now();
        let mut state = lock(&self.state);
        if state.known.len() >= MAX_KNOWN && !state.known.contains_key(&ip) {
            let known_for = self.limits.known_for;
            state.known.retain(|_, at| now.duration_since(*at) < known_for);
            if state.known.len() >= MAX_KNOWN {
                return;
            }
        }
        state.known.insert(ip, now);
    }

    fn is_known(&self, ip: IpAddr) -> bool {
        lock(&self.state).known.get(&ip).is_some_and(|at| at.elapsed() < self.limits.known_for)
    }

    /// Waits (without a handshake slot) until `tcp` has bytes to read, making room among the
    /// waiting connections by closing the oldest idle one where a bound is reached.
    async fn first_bytes(&self, tcp: &TcpStream, ip: IpAddr) -> Result<(), Refused> {
        let (close, closed) = oneshot::channel();
        let waiting = {
            let mut state = lock(&self.state);
            if state.waiting_by_ip.get(&ip).copied().unwrap_or_default() >= self.limits.waiting_per_ip {
                let oldest = state.waiting.iter().find(|(_, (at, _))| *at == ip).map(|(id, _)| *id);
                evict(&mut state, oldest);
            }
            if state.waiting.len() >= self.limits.waiting {
                let oldest = state.waiting.keys().next().copied();
                evict(&mut state, oldest);
            }
            let id = state.next;
            state.next += 1;
            state.waiting.insert(id, (ip, close));
            *state.waiting_by_ip.entry(ip).or_default() += 1;
            Waiting { id, ip, state: self.state.clone() }
        };
        let mut byte = [0u8; 1];
        let outcome = tokio::select! {
            r = tcp.peek(&mut byte) => match r {
                Ok(n) if n > 0 => Ok(()),
                _ => Err(Refused::Closed),
            },
            _ = closed => Err(Refused::Evicted),
            _ = tokio::time::sleep(self.limits.first_bytes) => Err(Refused::Idle),
        };
        drop(waiting);
        outcome
    }
}

/// Takes back a per-address handshake count if the slot was not granted.
struct Counted {
    ip: IpAddr,
    state: Arc<Mutex<State>>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        decrement(&mut lock(&self.state).handshaking_by_ip, self.ip);
    }
}

fn evict(state: &mut State, id: Option<u64>) {
    if let Some((ip, close)) = id.and_then(|id| state.waiting.remove(&id)) {
        decrement(&mut state.waiting_by_ip, ip);
        let _ = close.send(());
    }
}

fn decrement(counts: &mut HashMap<IpAddr, usize>, ip: IpAddr) {
    if let Some(n) = counts.get_mut(&ip) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(&ip);
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    async fn pair(listener: &TcpListener, from: IpAddr) -> (TcpStream, TcpStream) {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind((from, 0).into()).expect("bind");
        let client = socket.connect(listener.local_addr().expect("addr")).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    fn limits() -> HandshakeLimits {
        HandshakeLimits {
            first_bytes: Duration::from_millis(300),
            handshake: Duration::from_secs(2),
            waiting: 4,
            waiting_per_ip: 2,
            handshakes: 2,
            reserved: 1,
            handshakes_per_ip: 1,
            known_for: Duration::from_secs(60),
        }
    }

    #[tokio::test]
    async fn idle_connections_give_way_and_time_out() {
        let gate = HandshakeGate::new(limits());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let ip: IpAddr = [127, 0, 0, 1].into();
        let (_c1, s1) = pair(&listener, ip).await;
        let (_c2, s2) = pair(&listener, ip).await;
        let g = gate.clone();
        let first = tokio::spawn(async move { g.admit(&s1, ip, Instant::now()).await.map(drop) });
        let g = gate.clone();
        let second = tokio::spawn(async move { g.admit(&s2, ip, Instant::now()).await.map(drop) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        // A third connection of the same address closes the oldest idle one, and gets a slot
        // as soon as it speaks.
        let (mut c3, s3) = pair(&listener, ip).await;
        c3.write_all(b"\x16").await.expect("write");
        let slot = gate.admit(&s3, ip, Instant::now()).await.expect("admitted");
        assert_eq!(first.await.expect("task"), Err(Refused::Evicted));
        assert_eq!(second.await.expect("task"), Err(Refused::Idle));
        // One handshake per address at once.
        let (mut c4, s4) = pair(&listener, ip).await;
        c4.write_all(b"\x16").await.expect("write");
        assert_eq!(gate.admit(&s4, ip, Instant::now()).await.err(), Some(Refused::PerIp));
        drop(slot);
        assert!(gate.admit(&s4, ip, Instant::now()).await.is_ok());
    }

    #[tokio::test]
    async fn reserved_slots_serve_only_known_peers() {
        let gate = HandshakeGate::new(HandshakeLimits { handshake: Duration::from_millis(300), ..limits() });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (stranger, other_stranger, known): (IpAddr, IpAddr, IpAddr) =
            ([127, 0, 0, 2].into(), [127, 0, 0, 3].into(), [127, 0, 0, 1].into());
        gate.completed(known);
        let mut held = Vec::new();
        for ip in [stranger, other_stranger, known] {
            let (mut c, s) = pair(&listener, ip).await;
            c.write_all(b"\x16").await.expect("write");
            held.push((c, s, ip));
        }
        let _first = gate.admit(&held[0].1, stranger, Instant::now()).await.expect("the open slot");
        assert_eq!(gate.admit(&held[1].1, other_stranger, Instant::now()).await.err(), Some(Refused::Busy));
        assert!(gate.admit(&held[2].1, known, Instant::now()).await.is_ok(), "the reserved slot");
    }
}
