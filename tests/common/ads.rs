//! meshpilot's ADS server in the test process, on a plaintext and a secure (TLS) listener on
//! 127.0.0.1, serving snapshots the test builds: what no file source can hold (Kubernetes
//! Secrets) without a kube-apiserver. Clients are real gRPC clients over TCP; the server is the
//! one the binary runs (`AdsServer`, the secure port's TLS accept loop and authenticator).

use std::net::SocketAddr;
use std::sync::Arc;

use meshpilot::config::parse::{parse_file, Document};
use meshpilot::drain::DrainTrigger;
use meshpilot::registry::kubernetes::KubeObject;
use meshpilot::security::ca::CertificateAuthority;
use meshpilot::security::tls::{accept, certified_key, server_config, ClientAuth, ServingCert};
use meshpilot::security::{Authenticator, SharedTrustDomain, TrustDomain};
use meshpilot::snapshot::{ChangeSet, Snapshot, SnapshotWriter, SourceState, Version};
use meshpilot::telemetry::metrics::Registry;
use meshpilot::xds::AdmissionSettings;
use meshpilot::xds::AdsServer;
use meshpilot::xds::ConnectionRegistry;
use meshpilot::xds::XdsMetrics;
use tokio::task::JoinHandle;

use super::secure::ISTIOD_NAME;

/// A source state of `yaml`'s config objects (all must be valid) and `kube` objects.
pub fn state(yaml: &str, kube: Vec<KubeObject>) -> SourceState {
    let mut state =
        SourceState { kube: kube.into_iter().map(|o| (o.key(), Arc::new(o))).collect(), ..Default::default() };
    for doc in parse_file("test.yaml", yaml) {
        let Document::Valid(o) = doc else { panic!("invalid test config: {doc:?}") };
        state.configs.insert(o.key.clone(), Arc::new(o));
    }
    state
}

/// The running server; dropping it stops both listeners.
pub struct InProcessAds {
    /// The plaintext listener (`--xds-addr`).
    pub plaintext: SocketAddr,
    /// The secure listener (`--secure-xds-addr`): TLS for [`ISTIOD_NAME`], client certificates
    /// from [`InProcessAds::ca`].
    pub secure: SocketAddr,
    /// The CA's root (PEM), for clients.
    pub root: String,
    /// The CA that issues client certificates.
    pub ca: CertificateAuthority,
    /// The metrics the server registers.
    pub metrics: Registry,
    writer: SnapshotWriter,
    seq: u64,
    _drain: DrainTrigger,
    tasks: Vec<JoinHandle<()>>,
}

impl InProcessAds {
    /// Starts serving `state` as the first snapshot, with `server` building the ADS server from
    /// its parts (the default: [`AdsServer::new`] with default admission).
    pub async fn start(state: &SourceState) -> InProcessAds {
        Self::start_with(state, |snapshots, registry, metrics, drain| {
            AdsServer::new(snapshots, registry, metrics, drain, AdmissionSettings::default())
        })
        .await
    }

    /// As [`InProcessAds::start`], the server built by `server`.
    pub async fn start_with(
        state: &SourceState,
        server: impl FnOnce(
            meshpilot::snapshot::SnapshotReader,
            Arc<ConnectionRegistry>,
            XdsMetrics,
            meshpilot::drain::DrainWatcher,
        ) -> AdsServer,
    ) -> InProcessAds {
        let (writer, reader) = meshpilot::snapshot::channel();
        let (trigger, drain) = meshpilot::drain::new();
        let registry = Registry::new();
        let metrics = XdsMetrics::register(&registry);
        let connections = Arc::new(ConnectionRegistry::new(metrics.clone()));
        let ads = server(reader, connections, metrics, drain.clone());

        let material = CertificateAuthority::self_signed_material(&TrustDomain::default()).expect("a root");
        let ca = CertificateAuthority::new(material, Default::default()).expect("the CA");
        let issued = ca
            .issue_serving(&[ISTIOD_NAME.to_string()], &[], std::time::Duration::from_secs(3600))
            .expect("a serving certificate");
        let serving = ServingCert::new(certified_key(&issued.chain_pem, &issued.key_pem).expect("key"));
        let roots = meshpilot::security::ca::material::parse_certs(ca.root_pem(), "root").expect("root");
        let tls = server_config(&roots, serving, ClientAuth::Optional).expect("TLS config");
        let authn = Authenticator::new(None, SharedTrustDomain::new(TrustDomain::default()));

        let plain_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let secure_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let (plaintext, secure) =
            (plain_listener.local_addr().expect("address"), secure_listener.local_addr().expect("address"));
        let mut tasks = Vec::new();
        let (service, stop) = (ads.clone().into_service(), drain.clone());
        tasks.push(tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(plain_listener);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, async move { stop.draining().await })
                .await;
        }));
        let (service, stop) = (ads.authenticated_service(authn), drain);
        tasks.push(tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(accept(secure_listener, tls), async move { stop.draining().await })
                .await;
        }));
        let mut server = InProcessAds {
            plaintext,
            secure,
            root: ca.root_pem().to_string(),
            ca,
            metrics: registry,
            writer,
            seq: 0,
            _drain: trigger,
            tasks,
        };
        server.publish(state);
        server
    }

    /// Publishes `state` as the next snapshot.
    pub fn publish(&mut self, state: &SourceState) {
        self.seq += 1;
        let snapshot = Snapshot::build(Version::new(1, self.seq), ChangeSet::full(), state);
        self.writer.publish(Arc::new(snapshot)).expect("versions grow");
    }

    /// A plaintext gRPC channel to the plaintext listener.
    pub async fn plaintext_channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.plaintext))
            .expect("endpoint")
            .connect()
            .await
            .expect("connects")
    }

    /// A TLS channel to the secure listener with a client certificate for `identity`.
    pub async fn secure_channel(&self, identity: &str) -> tonic::transport::Channel {
        let (chain, key) = super::secure::client_cert(&self.ca, identity);
        super::secure::channel(self.secure, &self.root, Some((&chain, &key))).await.expect("mTLS connects")
    }

    /// The value of the metric `name` (a series without labels), if registered.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let text = meshpilot::telemetry::metrics::render(&self.metrics);
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

impl Drop for InProcessAds {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}
