//! etcd over mutual TLS with certificates from meshpilot's CA: an ingest node given
//! `--etcd-cacert/--etcd-cert/--etcd-key` and an `https://` endpoint campaigns and leads; a
//! client without a certificate is refused by etcd's `--client-cert-auth`; plaintext endpoints
//! with TLS files are refused by meshpilot before it dials.

mod common;

use std::path::Path;
use std::time::Duration;

use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use common::poll::{poll, STARTUP_TIMEOUT};
use common::ports::free_port;
use common::process::{temp_dir, Process, ProcessSpec};
use meshpilot::cluster::etcd::{connect_with_tls, EtcdTls};
use meshpilot::security::ca::{CaSettings, CertificateAuthority};
use meshpilot::security::{Identity, TrustDomain};

/// Writes `text` to `dir/name` and returns the path.
fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("writing a PEM file");
    path
}

#[tokio::test]
async fn ingest_leads_through_an_etcd_that_requires_client_certificates_from_the_ca() {
    let material = CertificateAuthority::self_signed_material(&TrustDomain::default()).expect("a root");
    let ca = CertificateAuthority::new(material, CaSettings::default()).expect("a CA");
    let dir = temp_dir("meshpilot-etcd-tls-");
    let d = dir.path().to_path_buf();
    let serving = ca
        .issue_serving(&["localhost".into()], &[[127, 0, 0, 1].into()], Duration::from_secs(3600))
        .expect("etcd's certificate");
    let id = Identity::new(TrustDomain::default(), "meshpilot-system", "meshpilot-ingest").expect("identity");
    let client = ca.issue_workload(&id, Duration::from_secs(3600)).expect("a client certificate");
    let ca_file = write(&d, "ca.pem", ca.root_pem());
    let (server_cert, server_key) =
        (write(&d, "etcd.pem", &serving.chain_pem), write(&d, "etcd-key.pem", &serving.key_pem));
    let (client_cert, client_key) =
        (write(&d, "client.pem", &client.chain_pem), write(&d, "client-key.pem", &client.key_pem));

    let port = free_port();
    let endpoint = format!("https://127.0.0.1:{port}");
    let peer = format!("http://127.0.0.1:{}", free_port());
    let path = |p: &Path| p.display().to_string();
    let spec = ProcessSpec::new("etcd (TLS)", "etcd")
        .args(["--data-dir".to_string(), path(&d.join("data"))])
        .args(["--name", "default"])
        .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster".to_string(), format!("default={peer}")])
        .args(["--cert-file".to_string(), path(&server_cert), "--key-file".into(), path(&server_key)])
        .args(["--trusted-ca-file".to_string(), path(&ca_file), "--client-cert-auth".into()])
        .log_tail(60, 60);
    let etcd = Process::start(dir, spec);

    let tls = EtcdTls { ca: Some(ca_file.clone()), cert: Some(client_cert.clone()), key: Some(client_key.clone()) };
    let endpoints = vec![endpoint.clone()];
    let served = etcd
        .poll_while_running(STARTUP_TIMEOUT, async || {
            let Ok(mut c) = connect_with_tls(&endpoints, &tls).await else { return false };
            matches!(tokio::time::timeout(Duration::from_secs(2), c.status()).await, Ok(Ok(_)))
        })
        .await;
    assert!(served, "etcd did not answer over mTLS:\n{}", etcd.logs());

    // Trusting etcd but without a client certificate: etcd refuses the handshake.
    let server_only = EtcdTls { ca: Some(ca_file.clone()), cert: None, key: None };
    let refused = async {
        let mut c = connect_with_tls(&endpoints, &server_only).await.ok()?;
        c.status().await.ok()
    };
    assert!(
        matches!(tokio::time::timeout(Duration::from_secs(3), refused).await, Err(_) | Ok(None)),
        "served without a certificate"
    );
    // TLS files with a plaintext endpoint: refused before dialling.
    assert!(connect_with_tls(&[format!("http://127.0.0.1:{port}")], &tls).await.is_err());

    let config = temp_dir_with(&[]);
    let ingest = Meshpilot::ingest(&endpoint, config.path())
        .arg("--etcd-cacert")
        .arg(&path(&ca_file))
        .arg("--etcd-cert")
        .arg(&path(&client_cert))
        .arg("--etcd-key")
        .arg(&path(&client_key))
        .start();
    let leads = poll(STARTUP_TIMEOUT, async || ingest.is_leader().await).await;
    assert!(leads, "the ingest node did not lead through etcd over mTLS:\n{}", ingest.logs());
}
