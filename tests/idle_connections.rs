//! Thousands of TCP connections that never send a ClientHello, held open against the webhook
//! and the secure port, do not keep real callers out: a review posted over TLS is answered, and
//! an authenticated proxy gets CDS on the secure port, as quickly as without the flood.

use crate::common;

use std::time::{Duration, Instant};

use common::files::temp_dir_with;
use common::flood::idle_connections;
use common::meshpilot::Meshpilot;
use common::poll::{poll, STARTUP_TIMEOUT};
use common::ports::free_addr;
use common::secure::{ca_from_dir, channel, client_cert, cluster_names, first_cds, node};
use common::webhook::{admission_review, virtual_service, WebhookClient};

/// Idle connections per port: more than the handshake slots and the listen backlog together.
const FLOOD: usize = 3000;

/// What a real caller's request may take while the flood holds its sockets (a behaviour bound,
/// not a benchmark: without the flood it takes a few milliseconds).
const BOUND: Duration = Duration::from_secs(2);

const SERVICE_ENTRY: &str = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ext, namespace: \
                             ns-a}\nspec:\n  hosts: [ext.example.com]\n  location: MESH_EXTERNAL\n  resolution: DNS\n  \
                             ports: [{number: 80, name: http, protocol: HTTP}]\n";

#[tokio::test]
async fn idle_sockets_do_not_delay_webhook_reviews_or_secure_cds() {
    let dir = temp_dir_with(&[("se.yaml", SERVICE_ENTRY)]);
    let cp = Meshpilot::standalone(dir.path())
        .webhook(free_addr(), &["127.0.0.1".to_string()])
        .secure_xds(free_addr(), &[])
        .start();
    cp.wait_ready(STARTUP_TIMEOUT).await;
    let ca = ca_from_dir(&cp.ca_dir()).await;
    let webhook = WebhookClient::new(cp.webhook_addr(), &ca.material().roots().expect("roots"));
    let review =
        |uid: &str| admission_review(uid, ("networking.istio.io", "v1", "virtualservices"), &virtual_service("r"));
    let up = poll(STARTUP_TIMEOUT, async || webhook.post(&review("up")).await.is_ok()).await;
    assert!(up, "the webhook does not answer:\n{}", cp.log_tail(40));
    let (chain, key) = client_cert(&ca, "spiffe://cluster.local/ns/ns-a/sa/sa-a");
    let root = ca.root_pem().to_string();
    let secure_addr = cp.secure_xds_addr();
    let cds = async || {
        let ch = channel(secure_addr, &root, Some((&chain, &key))).await.map_err(|e| e.to_string())?;
        first_cds(ch, None, node("ns-a", "sa-a")).await.map_err(|e| e.to_string())
    };
    cds().await.expect("CDS before the flood");

    let webhook_flood = idle_connections(cp.webhook_addr(), FLOOD, 256).await;
    let secure_flood = idle_connections(secure_addr, FLOOD, 256).await;
    // The connects complete whether or not the fix is in (the kernel's backlog takes them when
    // the server does not): the flood is real either way.
    assert!(webhook_flood.held.len() > 1500 && secure_flood.held.len() > 1500, "the flood did not connect");

    for round in 0..3 {
        let started = Instant::now();
        let answer = tokio::time::timeout(BOUND, webhook.post(&review(&format!("during-{round}")))).await;
        let took = started.elapsed();
        let (status, body) =
            answer.unwrap_or_else(|_| panic!("review {round}: no answer within {BOUND:?}")).expect("answered");
        assert_eq!(status, 200, "{body}");
        let answer: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");

        let started = Instant::now();
        let response = tokio::time::timeout(BOUND, cds()).await;
        let cds_took = started.elapsed();
        let response = response.unwrap_or_else(|_| panic!("CDS {round}: no answer within {BOUND:?}")).expect("CDS");
        assert!(cluster_names(&response).iter().any(|n| n == "outbound|80||ext.example.com"));
        eprintln!("round {round}: review in {took:?}, secure CDS in {cds_took:?}");
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    drop((webhook_flood, secure_flood));
}
