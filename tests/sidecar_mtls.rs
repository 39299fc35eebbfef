//! Mesh mutual TLS between real Istio sidecars (pilot-agent + Envoy behind Istio's iptables),
//! configured by meshpilot from a real kube-apiserver. No CA runs: each pod's pilot-agent serves
//! the SPIFFE certificate the test wrote for it (Istio's mounted-certificate mode, see
//! `common::sidecar`), so this keeps working when meshpilot's CA lands.
//!
//! `client` calls `server` through its outbound side: auto mTLS (the server pod carries
//! `security.istio.io/tlsMode: istio`) makes that ISTIO_MUTUAL, and the server's inbound side sees
//! the client's SPIFFE identity. A plaintext client without sidecar is served under PERMISSIVE
//! (the default) and refused once a PeerAuthentication makes the namespace STRICT.

use crate::common;

use std::net::{Ipv4Addr, SocketAddr};

use common::ingress::Ingress;
use common::istio::NS;
use common::kube::{apply, KubeApi, ADMIN_TOKEN};
use common::mesh::wait_synced;
use common::meshpilot::Meshpilot;
use common::netns::NetNs;
use common::poll::{poll, CONVERGE_TIMEOUT, STARTUP_TIMEOUT};
use common::sidecar::{server_service, SidecarPod, NODE_NAME};
use kube::Client;

/// Cluster IP and port of Service `server` (`http`).
const SERVER_SVC: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 96, 78, 10), 80);

struct Pods {
    client: SidecarPod,
    server: SidecarPod,
    plain: NetNs,
    _cp: Meshpilot,
    _xds_net: NetNs,
    kube: Client,
    _api: KubeApi,
}

fn peer_authentication(mode: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: {NS}}}\n\
         spec: {{mtls: {{mode: {mode}}}}}\n"
    )
}

impl Pods {
    async fn start() -> Option<Pods> {
        let client = SidecarPod::builder("client-1", NS)?.label("app", "client").service_account("client");
        let server = SidecarPod::builder("server-1", NS)?.label("app", "server").service_account("server");
        let plain = NetNs::create(1)?;
        client.netns().link(server.netns());
        plain.link(server.netns());
        let api = KubeApi::start().await?;
        let kube = api.admin().await;
        let mut objects = vec![
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n"),
            format!("apiVersion: v1\nkind: Node\nmetadata: {{name: {NODE_NAME}}}\n"),
            client.pod_yaml(),
            server.pod_yaml(),
        ];
        objects.extend(server_service(NS, SERVER_SVC, "server-1", server.ip(), server.app_port()));
        for object in &objects {
            apply(&kube, object).await;
        }
        let dir = api.dir().to_path_buf();
        let kubeconfig = api.write_kubeconfig(&dir, "meshpilot.kubeconfig", &api.url(), ADMIN_TOKEN);
        // meshpilot listens on the host end of a namespace of its own: the linked pods route each
        // other's subnets over their link, so neither pod's host end would do for both.
        let xds_net = NetNs::create(0)?;
        let xds_addr = SocketAddr::from((xds_net.host_addr(), common::ports::free_port()));
        let cp = Meshpilot::standalone_on_kubernetes(kubeconfig).xds_addr(xds_addr).debounce_after("50ms").start();
        cp.wait_ready(STARTUP_TIMEOUT).await;
        let (client, server) = (client.start(cp.xds_addr()).await, server.start(cp.xds_addr()).await);
        wait_synced(&cp, &[client.node_id(), server.node_id()]).await;
        Some(Pods { client, server, plain, _cp: cp, _xds_net: xds_net, kube, _api: api })
    }

    /// A client without sidecar, connecting straight to the server pod's app port.
    async fn plaintext(&self) -> (common::netns::Forward, Ingress) {
        let forward = self.plain.forward(SocketAddr::from((self.server.ip(), self.server.app_port()))).await;
        let ingress = Ingress::new(forward.port(), &format!("server.{NS}.svc.cluster.local"));
        (forward, ingress)
    }
}

#[tokio::test]
async fn sidecars_talk_mutual_tls_and_strict_refuses_plaintext_clients() {
    let Some(pods) = Pods::start().await else { return };
    let (_fwd, via_sidecar) = {
        let forward = pods.client.outbound(SocketAddr::from(SERVER_SVC)).await;
        let ingress = Ingress::new(forward.port(), &format!("server:{}", SERVER_SVC.1));
        (forward, ingress)
    };

    // Client → server: ISTIO_MUTUAL by auto mTLS, the server's inbound side terminating it.
    via_sidecar.wait_all_from("/", &[], "server-1", 3).await;
    let handshakes = format!("cluster.outbound|{}||server.{NS}.svc.cluster.local;.ssl.handshake", SERVER_SVC.1);
    assert!(pods.client.stat(&handshakes).await >= 1, "{handshakes}: the client's Envoy made no TLS handshake");
    let echo = via_sidecar.echo("/", &[]).await;
    let xfcc = echo["headers"]["x-forwarded-client-cert"].as_str().unwrap_or_default().to_string();
    assert!(
        xfcc.contains(&format!("URI=spiffe://cluster.local/ns/{NS}/sa/client")),
        "the server's sidecar saw no client SPIFFE identity: {echo:#}"
    );
    assert!(
        xfcc.contains(&format!("By=spiffe://cluster.local/ns/{NS}/sa/server")),
        "the server's sidecar served another certificate: {xfcc}"
    );

    // PERMISSIVE (no policy): a client without sidecar is served in plaintext.
    let (_plain_fwd, plain) = pods.plaintext().await;
    plain.wait_backend("/", &[], "server-1").await;
    let echo = plain.echo("/", &[]).await;
    assert!(echo["headers"]["x-forwarded-client-cert"].is_null(), "plaintext has no peer: {echo:#}");

    // STRICT: the plaintext client is refused; the mesh client still gets through.
    apply(&pods.kube, &peer_authentication("STRICT")).await;
    let refused = poll(CONVERGE_TIMEOUT, async || match plain.try_get("/", &[]).await {
        Err(_) => true,
        Ok(r) => r.status != 200,
    })
    .await;
    assert!(refused, "STRICT: the plaintext client is still served");
    for _ in 0..3 {
        assert!(plain.try_get("/", &[]).await.map_or(true, |r| r.status != 200), "STRICT let plaintext through");
    }
    via_sidecar.wait_all_from("/", &[], "server-1", 3).await;

    // Back to PERMISSIVE: plaintext is served again.
    apply(&pods.kube, &peer_authentication("PERMISSIVE")).await;
    plain.wait_backend("/", &[], "server-1").await;
    pods.client.assert_no_rejections().await;
    pods.server.assert_no_rejections().await;
}
