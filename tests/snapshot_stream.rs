//! Snapshot subscription over real gRPC on 127.0.0.1: a leader's `SnapshotServer` and frontends'
//! `SnapshotSubscriber`s, checking versions held and that frontends rebuild the leader's snapshots.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::poll::poll_every;
use common::ports::bind_local;
use meshpilot::cluster::election::LeaderInfo;
use meshpilot::config::parse::object_from_value;
use meshpilot::registry::kubernetes::{KubeNamespace, KubeNode, KubeObject};
use meshpilot::replication::wire::proto::snapshot_service_client::SnapshotServiceClient;
use meshpilot::replication::wire::proto::SubscribeRequest;
use meshpilot::replication::wire::{encode_full, version_from_wire, CHUNK_SIZE};
use meshpilot::replication::{
    ServerSettings, SnapshotServer, SnapshotSubscriber, SubscriberSettings, SubscriberStatus,
};
use meshpilot::snapshot::{
    channel, ChangeSet, ChangedKey, Snapshot, SnapshotBuilder, SnapshotReader, SnapshotWriter, SourceState, Version,
};
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Generous: the machine is shared and debug builds are slow.
const TIMEOUT: Duration = Duration::from_secs(30);

/// A ServiceEntry `name` in namespace `ns` with `endpoints` addresses.
fn service_entry(name: &str, endpoints: usize) -> serde_json::Value {
    let endpoints: Vec<_> = (0..endpoints)
        .map(|i| {
            json!({"address": format!("10.{}.{}.{}", i / 65536 % 256, i / 256 % 256, i % 256),
                   "labels": {"app": name, "version": format!("v{i}"), "zone": "zone-a-with-a-long-label-value"}})
        })
        .collect();
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": "ns", "labels": {"team": "payments"}},
        "spec": {"hosts": [format!("{name}.example.com")], "location": "MESH_INTERNAL", "resolution": "STATIC",
                 "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}], "endpoints": endpoints}
    })
}

/// A source state with one ServiceEntry per name, and Kubernetes objects: a Namespace, and a
/// Node named after `endpoints` (so states with different endpoints differ in Kubernetes objects).
fn state_of(names: &[String], endpoints: usize) -> SourceState {
    let mut state = SourceState::default();
    for name in names {
        let obj = object_from_value(service_entry(name, endpoints)).unwrap().unwrap();
        state.configs.insert(obj.key.clone(), Arc::new(obj));
    }
    let namespace = KubeObject::Namespace(KubeNamespace { name: "ns".into(), labels: Default::default() });
    let node = KubeObject::Node(KubeNode {
        name: format!("node-{endpoints}"),
        region: "region-1".into(),
        zone: "zone-1".into(),
        subzone: String::new(),
    });
    for o in [namespace, node] {
        state.kube.insert(o.key(), Arc::new(o));
    }
    state
}

/// The memory test measures this process's resident memory: it runs alone (writer), the other
/// tests of this file beside each other (readers).
static MEMORY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

/// An ingest's snapshot channel served by a `SnapshotServer` on a free port, and the builder it
/// builds with (so its change sets are classified as a real leader's are).
struct Leader {
    builder: std::sync::Mutex<SnapshotBuilder>,
    writer: SnapshotWriter,
    is_leader: watch::Sender<bool>,
    server: SnapshotServer,
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Leader {
    async fn start(settings: ServerSettings) -> Leader {
        let (writer, reader) = channel();
        let (is_leader, flag) = watch::channel(true);
        let server = SnapshotServer::new(reader, flag, settings);
        let (addr, task) = serve(server.clone()).await;
        Leader { builder: Default::default(), writer, is_leader, server, addr, task }
    }

    fn publish(&self, version: Version, state: &SourceState) -> Arc<Snapshot> {
        self.publish_with(version, ChangeSet::default(), state)
    }

    fn publish_with(&self, version: Version, changes: ChangeSet, state: &SourceState) -> Arc<Snapshot> {
        let snapshot = {
            let mut builder = self.builder.lock().unwrap();
            let mut found = builder.replace(state.clone());
            found.merge(changes);
            builder.build(version, found)
        };
        self.writer.publish(snapshot.clone()).unwrap();
        snapshot
    }

    fn info(&self, term: u64) -> LeaderInfo {
        LeaderInfo { addr: self.addr.to_string(), term }
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `server` on a free 127.0.0.1 port.
async fn serve(server: SnapshotServer) -> (SocketAddr, JoinHandle<()>) {
    let listener = bind_local().await;
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        server
            .transport()
            .add_service(server.into_service())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (addr, task)
}

/// A frontend: a subscriber publishing into its own snapshot channel.
struct Frontend {
    leader: watch::Sender<Option<LeaderInfo>>,
    reader: SnapshotReader,
    status: watch::Receiver<SubscriberStatus>,
    _shutdown: meshpilot::drain::DrainTrigger,
}

impl Frontend {
    fn start(leader: Option<LeaderInfo>) -> Frontend {
        let (writer, reader) = channel();
        let (leader_tx, leader_rx) = watch::channel(leader);
        let (shutdown, drain) = meshpilot::drain::new();
        let settings = SubscriberSettings::new("frontend-test");
        let subscriber = SnapshotSubscriber::new(settings, leader_rx, writer);
        let status = subscriber.status();
        tokio::spawn(subscriber.run(drain));
        Frontend { leader: leader_tx, reader, status, _shutdown: shutdown }
    }

    /// Waits until the status satisfies `f`, failing the test after [`TIMEOUT`].
    async fn wait(&mut self, what: &str, f: impl Fn(&SubscriberStatus) -> bool) -> SubscriberStatus {
        let found = match tokio::time::timeout(TIMEOUT, self.status.wait_for(|s| f(s))).await {
            Ok(Ok(s)) => Some(s.clone()),
            _ => None,
        };
        found.unwrap_or_else(|| panic!("timed out waiting for {what}; status: {:?}", *self.status.borrow()))
    }

    async fn wait_held(&mut self, v: Version) -> SubscriberStatus {
        self.wait(&format!("version {v}"), |s| s.held == Some(v)).await
    }

    fn current(&self) -> Arc<Snapshot> {
        self.reader.current().expect("a snapshot")
    }
}

/// The frontend's snapshot is the leader's: same config and Kubernetes objects, registry, errors
/// and mesh.
fn assert_same(frontend: &Snapshot, leader: &Snapshot) {
    assert_eq!(frontend.version, leader.version);
    assert_eq!(frontend.configs, leader.configs);
    assert_eq!(frontend.kube, leader.kube);
    assert_eq!(frontend.registry, leader.registry);
    assert_eq!(frontend.errors, leader.errors);
    assert_eq!(frontend.mesh, leader.mesh);
}

#[tokio::test]
async fn full_then_deltas() {
    let _beside = MEMORY.read().await;
    let leader = Leader::start(ServerSettings::default()).await;
    let mut all = names("svc", 20);
    let s1 = leader.publish(Version::new(1, 1), &state_of(&all, 2));
    let mut fe = Frontend::start(Some(leader.info(1)));
    let st = fe.wait_held(Version::new(1, 1)).await;
    assert_eq!(st.fulls_applied, 1);
    assert!(fe.current().changes.full);
    assert_same(&fe.current(), &s1);

    all.push("added".into());
    let s2 = leader.publish(Version::new(1, 2), &state_of(&all, 2));
    fe.wait_held(Version::new(1, 2)).await;
    assert_same(&fe.current(), &s2);
    all.remove(0);
    let s3 = leader.publish(Version::new(1, 3), &state_of(&all, 3));
    let st = fe.wait_held(Version::new(1, 3)).await;
    assert_same(&fe.current(), &s3);
    assert_eq!(st.fulls_applied, 1, "{st:?}");
    assert!(st.deltas_applied >= 1, "{st:?}");
    assert_eq!(st.lag(), 0);
    assert!(!fe.current().changes.full, "a delta carries the changed keys: {:?}", fe.current().changes);
    assert_eq!(leader.server.subscribers(), 1);
}

#[tokio::test]
async fn resumes_with_deltas_after_reconnect() {
    let _beside = MEMORY.read().await;
    let leader = Leader::start(ServerSettings::default()).await;
    let all = names("svc", 10);
    leader.publish(Version::new(1, 1), &state_of(&all, 1));
    let mut fe = Frontend::start(Some(leader.info(1)));
    fe.wait_held(Version::new(1, 1)).await;

    // The leader is away for a while (no leader known) and publishes meanwhile.
    fe.leader.send_replace(None);
    fe.wait("disconnect", |s| !s.connected).await;
    leader.publish(Version::new(1, 2), &state_of(&all[1..], 1));
    let s3 = leader.publish(Version::new(1, 3), &state_of(&all[2..], 1));
    // Back at another address (same server): the frontend resumes from 1.1 with one delta.
    let (addr2, _task) = serve(leader.server.clone()).await;
    fe.leader.send_replace(Some(LeaderInfo { addr: format!("http://{addr2}"), term: 1 }));
    let st = fe.wait_held(Version::new(1, 3)).await;
    assert_eq!(st.fulls_applied, 1, "{st:?}");
    assert_eq!(st.deltas_applied, 1, "{st:?}");
    assert!(st.reconnects >= 1, "{st:?}");
    assert_same(&fe.current(), &s3);
}

#[tokio::test]
async fn a_version_gone_from_history_gets_a_full_snapshot() {
    let _beside = MEMORY.read().await;
    let leader = Leader::start(ServerSettings { history: 2, ..Default::default() }).await;
    let all = names("svc", 10);
    leader.publish(Version::new(1, 1), &state_of(&all, 1));
    let mut fe = Frontend::start(Some(leader.info(1)));
    fe.wait_held(Version::new(1, 1)).await;
    fe.leader.send_replace(None);
    fe.wait("disconnect", |s| !s.connected).await;
    let mut last = None;
    for seq in 2..=6 {
        let state = state_of(&all[..10 - seq as usize], 1);
        last = Some(leader.publish(Version::new(1, seq), &state));
        // The server follows a watch channel; let it record every version (as an ingest's pace
        // would), so that 1.1 leaves the history rather than being skipped.
        wait_server_latest(&leader.server, Version::new(1, seq)).await;
    }
    fe.leader.send_replace(Some(leader.info(1)));
    let st = fe.wait_held(Version::new(1, 6)).await;
    assert_eq!(st.fulls_applied, 2, "{st:?}");
    assert_same(&fe.current(), &last.unwrap());
}

#[tokio::test]
async fn a_new_term_with_identical_config_changes_nothing_and_lower_terms_are_refused() {
    let _beside = MEMORY.read().await;
    let old = Leader::start(ServerSettings::default()).await;
    let all = names("svc", 15);
    let before = old.publish(Version::new(1, 3), &state_of(&all, 2));
    let mut fe = Frontend::start(Some(old.info(1)));
    fe.wait_held(Version::new(1, 3)).await;

    // Failover: a new leader of term 2 built the same config from its own sources.
    let new = Leader::start(ServerSettings::default()).await;
    let after = new.publish(Version::new(2, 1), &state_of(&all, 2));
    old.is_leader.send_replace(false);
    fe.leader.send_replace(Some(new.info(2)));
    let st = fe.wait_held(Version::new(2, 1)).await;
    assert_eq!(st.highest_term, 2);
    let snap = fe.current();
    assert_eq!(snap.configs, before.configs);
    assert_same(&snap, &after);
    assert!(snap.changes.is_empty(), "identical config, nothing to push: {:?}", snap.changes);

    // The old leader still thinks it leads and publishes: the frontend refuses its term.
    old.is_leader.send_replace(true);
    old.publish(Version::new(1, 4), &state_of(&all[1..], 2));
    fe.leader.send_replace(Some(old.info(1)));
    let st = fe.wait("refusal of term 1", |s| s.refused_lower_term >= 1).await;
    assert_eq!(st.held, Some(Version::new(2, 1)), "{st:?}");
    assert!(st.last_error.as_deref().unwrap_or_default().contains("term"), "{st:?}");
    assert_eq!(fe.current().version, Version::new(2, 1));
    assert_eq!(fe.current().configs, before.configs);
}

#[tokio::test]
async fn large_snapshots_travel_in_chunks() {
    let _beside = MEMORY.read().await;
    let leader = Leader::start(ServerSettings::default()).await;
    let all = names("service-entry-", 5000);
    let s1 = leader.publish(Version::new(1, 1), &state_of(&all, 4));
    let encoded = encode_full(&s1).unwrap();
    assert!(encoded.len() > 4 * 1024 * 1024, "payload only {} bytes", encoded.len());
    assert!(encoded.len().div_ceil(CHUNK_SIZE) >= 5);

    let mut fe = Frontend::start(Some(leader.info(1)));
    let st = fe.wait_held(Version::new(1, 1)).await;
    assert_eq!(st.fulls_applied, 1);
    assert_same(&fe.current(), &s1);

    // A delta on top of the big state: one object changes.
    let mut state = state_of(&all, 4);
    let changed = object_from_value(service_entry("service-entry-7", 5)).unwrap().unwrap();
    let mut changes = ChangeSet::default();
    changes.keys.insert(ChangedKey::Config(changed.key.clone()));
    state.configs.insert(changed.key.clone(), Arc::new(changed));
    let s2 = leader.publish_with(Version::new(1, 2), changes, &state);
    let st = fe.wait_held(Version::new(1, 2)).await;
    assert_eq!(st.deltas_applied, 1);
    assert_same(&fe.current(), &s2);
    assert_eq!(fe.current().changes, s2.changes, "the leader's changes travel with the delta");
}

#[tokio::test]
async fn a_deposed_leader_ends_streams_and_refuses_subscriptions() {
    let _beside = MEMORY.read().await;
    let leader = Leader::start(ServerSettings::default()).await;
    leader.publish(Version::new(1, 1), &state_of(&names("svc", 3), 1));
    let mut fe = Frontend::start(Some(leader.info(1)));
    fe.wait_held(Version::new(1, 1)).await;

    // A raw client too, to see the status itself.
    let mut client = SnapshotServiceClient::connect(format!("http://{}", leader.addr)).await.unwrap();
    let request =
        || SubscribeRequest { frontend_id: "raw".into(), trace_context: HashMap::new(), ..Default::default() };
    let mut stream = client.subscribe(request()).await.unwrap().into_inner();
    let first = tokio::time::timeout(TIMEOUT, stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.index, 0);

    leader.is_leader.send_replace(false);
    let ended = tokio::time::timeout(TIMEOUT, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(ended.unwrap_err().code(), tonic::Code::Unavailable);
    let refused = client.subscribe(request()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);

    let st = fe.wait("the stream to end", |s| !s.connected && s.last_error.is_some()).await;
    assert!(st.last_error.as_deref().unwrap_or_default().contains("not the leader"), "{st:?}");
    assert_eq!(fe.current().version, Version::new(1, 1), "the frontend keeps its snapshot");

    // Leader again: the frontend reconnects (with backoff) and catches up with a delta.
    leader.publish(Version::new(1, 2), &state_of(&names("svc", 4), 1));
    leader.is_leader.send_replace(true);
    let st = fe.wait_held(Version::new(1, 2)).await;
    assert_eq!(st.fulls_applied, 1, "{st:?}");
    assert!(st.reconnects >= 1, "{st:?}");
}

#[tokio::test]
async fn a_delta_on_another_base_makes_the_frontend_ask_for_a_full_snapshot() {
    let _beside = MEMORY.read().await;
    // Two servers claiming the same term cannot happen with a working election; here it makes the
    // leader send deltas whose base the frontend does not hold.
    let a = Leader::start(ServerSettings::default()).await;
    let b = Leader::start(ServerSettings::default()).await;
    let all = names("svc", 8);
    a.publish(Version::new(1, 7), &state_of(&all, 1));
    b.publish(Version::new(1, 5), &state_of(&all[1..], 1));
    let mut fe = Frontend::start(Some(a.info(1)));
    fe.wait_held(Version::new(1, 7)).await;
    fe.leader.send_replace(Some(b.info(1)));
    fe.wait("connected to b", |s| s.connected && s.leader.as_ref().is_some_and(|l| l.addr == b.addr.to_string())).await;
    // Older than what the frontend holds: skipped.
    b.publish(Version::new(1, 6), &state_of(&all[2..], 1));
    // Newer, but a delta on 1.6: the frontend asks for a full snapshot and applies that.
    let last = b.publish(Version::new(1, 8), &state_of(&all[3..], 1));
    let st = fe.wait_held(Version::new(1, 8)).await;
    assert_eq!(st.fulls_applied, 2, "{st:?}");
    assert!(st.resyncs >= 1, "{st:?}");
    assert_same(&fe.current(), &last);
}

/// Waits until the server has recorded `v`.
async fn wait_server_latest(server: &SnapshotServer, v: Version) {
    let seen = poll_every(Duration::from_millis(10), TIMEOUT, async || server.latest() == Some(v)).await;
    assert!(seen, "server never saw {v}");
}

/// A raw HTTP/2 client on its own connection: it subscribes (holding nothing), then never reads
/// a byte, so it never acknowledges a ping nor opens its flow-control window.
async fn subscribe_and_never_read(addr: SocketAddr, id: usize) -> tokio::net::TcpStream {
    use prost::Message;
    use tokio::io::AsyncWriteExt;
    fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
        out.extend_from_slice(&[kind, flags]);
        out.extend_from_slice(&stream.to_be_bytes());
        out.extend_from_slice(payload);
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, 0x4, 0, 0, &[]);
    let authority = addr.to_string();
    let headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/meshpilot.snapshot.v1.SnapshotService/Subscribe"),
        (":authority", authority.as_str()),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    let mut block = Vec::new();
    for (name, value) in headers {
        // HPACK: a literal field without indexing, with a literal name (all shorter than 127).
        block.push(0);
        for s in [name, value] {
            block.push(s.len() as u8);
            block.extend_from_slice(s.as_bytes());
        }
    }
    frame(&mut out, 0x1, 0x4, 1, &block);
    let request = SubscribeRequest { frontend_id: format!("never-reads-{id}"), ..Default::default() }.encode_to_vec();
    let mut message = vec![0];
    message.extend_from_slice(&(request.len() as u32).to_be_bytes());
    message.extend_from_slice(&request);
    frame(&mut out, 0x0, 0x1, 1, &message);
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&out).await.unwrap();
    tcp
}

/// This process's resident memory, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    kb.trim().trim_end_matches(" kB").trim().parse::<u64>().unwrap() * 1024
}

/// Hundreds of subscribers that never read a byte (each on its own connection): only
/// `max_subscribers` are served at once and the rest refused with RESOURCE_EXHAUSTED, what the
/// server holds for them stays bounded (a subscriber shares the one encoding of a snapshot), they
/// are cut off (their connections closed: they answer no ping), after which new subscribers get
/// in, and a frontend that reads keeps getting every snapshot throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_that_never_read_are_bounded_and_cut_off() {
    let _alone = MEMORY.write().await;
    const MAX: usize = 32;
    const ATTACKERS: usize = 400;
    let settings = ServerSettings {
        max_subscribers: MAX,
        stall: Duration::from_millis(500),
        keepalive: Duration::from_secs(1),
        ..Default::default()
    };
    let leader = Leader::start(settings).await;
    let all = names("service-entry-", 2000);
    let s1 = leader.publish(Version::new(1, 1), &state_of(&all, 4));
    let payload = encode_full(&s1).unwrap().len();
    assert!(payload > 2 * 1024 * 1024, "payload only {payload} bytes");
    let mut fe = Frontend::start(Some(leader.info(1)));
    fe.wait_held(Version::new(1, 1)).await;
    let before = rss();

    let mut attackers = Vec::new();
    for i in 0..ATTACKERS {
        attackers.push(subscribe_and_never_read(leader.addr, i).await);
    }
    let full = poll_every(Duration::from_millis(50), TIMEOUT, async || leader.server.subscribers() == MAX).await;
    assert!(full, "{} subscribers", leader.server.subscribers());
    // Let every accepted one be sent what fits before it stalls.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = rss().saturating_sub(before);
    eprintln!("{ATTACKERS} non-reading subscribers of a {payload}-byte snapshot: RSS +{} KiB", held / 1024);
    // Each held copy of its snapshot would be `payload` bytes; a chunk each is what remains.
    assert!(held < 48 * 1024 * 1024, "RSS grew by {held} bytes");

    // Beyond the limit a subscription is refused, with a status a client can act on.
    let mut client = SnapshotServiceClient::connect(format!("http://{}", leader.addr)).await.unwrap();
    let request = SubscribeRequest { frontend_id: "late".into(), ..Default::default() };
    let refused = client.subscribe(request.clone()).await.expect_err("refused while full");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");

    // The frontend that reads keeps up.
    let s2 = leader.publish(Version::new(1, 2), &state_of(&all[1..], 4));
    fe.wait_held(Version::new(1, 2)).await;
    assert_same(&fe.current(), &s2);

    // The silent ones answer no ping: their connections are closed, their slots freed.
    let freed = poll_every(Duration::from_millis(100), TIMEOUT, async || leader.server.subscribers() <= 1).await;
    assert!(freed, "{} subscribers left", leader.server.subscribers());
    let mut stream = client.subscribe(request).await.expect("a new subscriber gets in").into_inner();
    let first = tokio::time::timeout(TIMEOUT, stream.message()).await.unwrap().unwrap().unwrap();
    assert_eq!(version_from_wire(first.version.as_ref()), Some(Version::new(1, 2)));
    drop(attackers);
}
