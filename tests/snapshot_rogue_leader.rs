//! Whoever can write etcd names the leader's address, but cannot make a frontend follow it: with
//! real etcd, `etcdctl` revokes the leader's lease and writes a rogue leader key naming a rogue
//! snapshot server (plaintext, then TLS with a certificate of the mesh's own CA for a frontend's
//! identity, not an ingest node's). Each serves real snapshots with a rogue ServiceEntry at a
//! term far above the real one. The frontend refuses it, says so in its log, and proxies keep
//! getting the real clusters; once the rogue key is gone, the frontend follows the real leader.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::etcd::Etcd;
use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use meshpilot::cluster::election::DEFAULT_ELECTION_NAME;
use meshpilot::config::parse::object_from_value;
use meshpilot::replication::{ServerSettings, SnapshotServer};
use meshpilot::security::ca::{CaMaterial, CaSettings, CertificateAuthority};
use meshpilot::security::tls::{self, ClientAuth, ServingCert};
use meshpilot::security::{Identity, TrustDomain};
use meshpilot::sim::{SimProxy, SimProxySpec, SimState};
use meshpilot::snapshot::{channel, ChangeSet, Snapshot, SnapshotWriter, SourceState, Version};
use meshpilot::xds::TypeUrl;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const SERVICE_ENTRY: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: \
                             default}\nspec:\n  hosts: [ext.example.com]\n  ports: [{number: 80, name: http, protocol: \
                             HTTP}]\n  resolution: DNS\n";
const REAL_CLUSTER: &str = "outbound|80||ext.example.com";
const ROGUE_CLUSTER: &str = "outbound|80||rogue.example.com";

/// A snapshot server that is not an ingest node of this mesh, serving a rogue ServiceEntry.
struct Rogue {
    addr: SocketAddr,
    server: SnapshotServer,
    _writer: SnapshotWriter,
    _leading: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Drop for Rogue {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn rogue_state() -> SourceState {
    let se = json!({
        "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "rogue", "namespace": "default"},
        "spec": {"hosts": ["rogue.example.com"], "resolution": "DNS",
                 "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}]}
    });
    let obj = object_from_value(se).expect("parses").expect("an object");
    let mut state = SourceState::default();
    state.configs.insert(obj.key.clone(), Arc::new(obj));
    state
}

impl Rogue {
    /// Serves on a free 127.0.0.1 port, over TLS with `tls`, else plaintext.
    async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Rogue {
        let (writer, reader) = channel();
        // A term far above the real leader's: nothing but the leader's identity can stop it.
        let version = Version { term: 1_000_000, seq: 1 };
        writer.publish(Arc::new(Snapshot::build(version, ChangeSet::default(), &rogue_state()))).expect("published");
        let (leading, flag) = watch::channel(true);
        let server = SnapshotServer::new(reader, flag, ServerSettings::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let service = server.clone().into_service();
        let task = tokio::spawn(async move {
            let builder = tonic::transport::Server::builder().add_service(service);
            let _ = match tls {
                Some(config) => builder.serve_with_incoming(tls::accept(listener, config)).await,
                None => builder.serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)).await,
            };
        });
        Rogue { addr, server, _writer: writer, _leading: leading, task }
    }
}

/// A TLS server configuration with a certificate of the CA in `cacerts` for 127.0.0.1 and
/// `identity` (a frontend's: a control-plane identity, but not an ingest node's).
fn tls_with_identity(cacerts: &std::path::Path, identity: &Identity) -> Arc<rustls::ServerConfig> {
    let material = CaMaterial::read_dir(cacerts).expect("reading cacerts").expect("a CA");
    let ca = CertificateAuthority::new(material, CaSettings::default()).expect("CA");
    let ip: IpAddr = [127, 0, 0, 1].into();
    let issued =
        ca.issue_serving_as(&[], &[ip], std::slice::from_ref(identity), Duration::from_secs(3600)).expect("issued");
    let key = tls::certified_key(&issued.chain_pem, &issued.key_pem).expect("key");
    let roots = ca.material().roots().expect("roots");
    tls::server_config(&roots, ServingCert::new(key), ClientAuth::Optional).expect("server config")
}

/// Runs `etcdctl --endpoints ENDPOINT ARGS...` and returns its output; panics on failure.
async fn etcdctl(etcd: &Etcd, args: &[&str]) -> String {
    let out = tokio::process::Command::new("etcdctl")
        .args(etcd.endpoint().etcdctl_args())
        .args(args)
        .output()
        .await
        .expect("running etcdctl");
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lease (hex, as etcdctl takes it) of the current leader's election key: the oldest key
/// under the election name that has a lease.
async fn leader_lease(etcd: &Etcd) -> String {
    let prefix = format!("{DEFAULT_ELECTION_NAME}/");
    let out = etcdctl(etcd, &["get", "--prefix", &prefix, "-w", "json"]).await;
    let answer: Value = serde_json::from_str(&out).expect("etcdctl json");
    let leader = answer["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|kv| kv["lease"].as_i64().unwrap_or(0) != 0)
        .min_by_key(|kv| kv["create_revision"].as_i64().unwrap_or(i64::MAX))
        .unwrap_or_else(|| panic!("no leader key: {out}"));
    format!("{:x}", leader["lease"].as_i64().expect("lease"))
}

/// The clusters a new simulated sidecar gets from `frontend`.
async fn clusters_served(frontend: &Meshpilot, name: &str) -> Vec<String> {
    let spec = SimProxySpec::sidecar(&frontend.xds_url(), "default", name, "10.1.0.9");
    let proxy = SimProxy::connect(spec).await.expect("ADS stream");
    let got =
        proxy.wait_for(CONVERGE_TIMEOUT, |s| s.types.get(&TypeUrl::Cluster).is_some_and(|t| t.responses > 0)).await;
    assert!(got, "no CDS response from {}", frontend.label());
    let state = proxy.state();
    state.types.get(&TypeUrl::Cluster).map(|t| t.names.iter().cloned().collect()).unwrap_or_default()
}

/// The leader address and whether it is connected, as `frontend` reports it.
async fn followed(frontend: &Meshpilot) -> Option<(String, bool)> {
    let node = frontend.try_node().await?;
    Some((node["leader"]["addr"].as_str()?.to_string(), node["connected"].as_bool()?))
}

#[tokio::test]
async fn a_rogue_leader_key_in_etcd_does_not_make_frontends_follow_it() {
    let etcd = Etcd::start().await;
    let config = temp_dir_with(&[("se.yaml", SERVICE_ENTRY)]);
    let ingest = Meshpilot::ingest(&etcd.endpoint(), config.path()).id("ingest-real").lease_ttl(2).start();
    ingest.wait_ready(STARTUP_TIMEOUT).await;
    let frontend = Meshpilot::frontend(&etcd.endpoint()).id("fe-a").lease_ttl(2).start();
    frontend.wait_ready(STARTUP_TIMEOUT).await;
    let real = ingest.snapshot_addr().to_string();

    let watching = SimProxy::connect(SimProxySpec::sidecar(&frontend.xds_url(), "default", "watching", "10.1.0.8"))
        .await
        .expect("ADS stream");
    let has_real = |s: &SimState| s.types.get(&TypeUrl::Cluster).is_some_and(|t| t.names.contains(REAL_CLUSTER));
    assert!(watching.wait_for(CONVERGE_TIMEOUT, has_real).await, "the proxy never got the real cluster");

    let cacerts = frontend.shared_ca_dir().expect("the harness's shared CA");
    let frontend_identity = Identity::new(TrustDomain::default(), "istio-system", "meshpilot-frontend").expect("id");
    let rogues = [
        ("plaintext", Rogue::start(None).await),
        (
            "TLS, same CA, a frontend's identity",
            Rogue::start(Some(tls_with_identity(&cacerts, &frontend_identity))).await,
        ),
    ];
    for (i, (what, rogue)) in rogues.iter().enumerate() {
        let refusals_before = frontend.logs().matches("refusing the peer").count();
        // The rogue key is written first, so it is next in line, then the leader's lease goes.
        let rogue_key = format!("{DEFAULT_ELECTION_NAME}/rogue-{i}");
        etcdctl(&etcd, &["put", &rogue_key, &rogue.addr.to_string()]).await;
        let lease = leader_lease(&etcd).await;
        etcdctl(&etcd, &["lease", "revoke", &lease]).await;

        let named = poll(CONVERGE_TIMEOUT, async || {
            followed(&frontend).await.is_some_and(|(addr, _)| addr == rogue.addr.to_string())
        })
        .await;
        assert!(named, "{what}: etcd's rogue leader never reached the frontend");
        // Until the frontend refused the rogue twice, or subscribed to it.
        let refusals = async || frontend.logs().matches("refusing the peer").count();
        let _ =
            poll(CONVERGE_TIMEOUT, async || refusals().await >= refusals_before + 2 || rogue.server.subscribers() > 0)
                .await;
        assert_eq!(rogue.server.subscribers(), 0, "{what}: the frontend subscribed to the rogue");
        assert_eq!(followed(&frontend).await.map(|(_, connected)| connected), Some(false), "{what}: connected");

        // Proxies, connected before or new, get the last real snapshot.
        assert!(has_real(&watching.state()), "{what}: the connected proxy lost the real cluster");
        let names = clusters_served(&frontend, &format!("new-{i}")).await;
        assert!(names.iter().any(|n| n == REAL_CLUSTER), "{what}: a new proxy got {names:?}");
        assert!(!names.iter().any(|n| n == ROGUE_CLUSTER), "{what}: a new proxy got the rogue's {names:?}");
        assert!(refusals().await >= refusals_before + 2, "{what}: no refusal logged:\n{}", frontend.logs());

        // Without the rogue key the real ingest node (campaigning again) leads, and is followed.
        etcdctl(&etcd, &["del", &rogue_key]).await;
        let back = poll(STARTUP_TIMEOUT, async || followed(&frontend).await == Some((real.clone(), true))).await;
        assert!(back, "{what}: the frontend did not follow the real leader again:\n{}", frontend.logs());
    }
    assert!(!frontend.logs().contains("rogue.example.com"), "the rogue's config reached the frontend");
}
