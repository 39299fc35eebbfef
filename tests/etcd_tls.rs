//! etcd over mutual TLS, meshpilot's default: an ingest node given
//! `--etcd-cacert/--etcd-cert/--etcd-key` and an `https://` endpoint campaigns and leads; a
//! client without a certificate is refused by etcd's `--client-cert-auth`; plaintext endpoints
//! with TLS files are refused by meshpilot before it dials.
//!
//! The attack of issue 27 (finding 3), with a real etcdctl: without a client certificate nobody
//! revokes the leader's lease, writes a rogue leader key or a fake frontend member, and frontends
//! keep following the real leader. meshpilot refuses to start on a plaintext etcd, or TLS
//! without a client certificate, unless `--insecure-etcd` says so (and then warns).

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::etcd::{Etcd, EtcdEndpoint};
use common::files::temp_dir_with;
use common::meshpilot::Meshpilot;
use common::poll::{poll, STARTUP_TIMEOUT};
use common::ports::free_port;
use common::process::{temp_dir, Process, ProcessSpec};
use meshpilot::cluster::election::DEFAULT_ELECTION_NAME;
use meshpilot::cluster::etcd::{connect_with_tls, EtcdTls};
use meshpilot::cluster::membership::DEFAULT_PREFIX;
use meshpilot::security::ca::{CaSettings, CertificateAuthority};
use meshpilot::security::{Identity, TrustDomain};
use serde_json::Value;

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

    let tls = EtcdTls {
        ca: Some(ca_file.clone()),
        cert: Some(client_cert.clone()),
        key: Some(client_key.clone()),
        insecure: false,
    };
    let endpoints = vec![endpoint.clone()];
    let served = etcd
        .poll_while_running(STARTUP_TIMEOUT, async || {
            let Ok(mut c) = connect_with_tls(&endpoints, &tls).await else { return false };
            matches!(tokio::time::timeout(Duration::from_secs(2), c.status()).await, Ok(Ok(_)))
        })
        .await;
    assert!(served, "etcd did not answer over mTLS:\n{}", etcd.logs());

    // Trusting etcd but without a client certificate: etcd refuses the handshake.
    let server_only = EtcdTls { ca: Some(ca_file.clone()), insecure: true, ..EtcdTls::default() };
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

/// `etcdctl ARGS` (a real client) with `access`'s flags: whether it succeeded, and its output.
async fn etcdctl(access: &[String], args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new("etcdctl");
    command.env("ETCDCTL_API", "3").arg("--command-timeout=3s").arg("--dial-timeout=2s").args(access).args(args);
    let out = tokio::task::spawn_blocking(move || command.output()).await.expect("joined").expect("etcdctl runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// The leader and member ids a frontend's `/debug/node` shows (nothing while unreachable).
async fn followed(frontend: &Meshpilot) -> (Value, Vec<String>) {
    let node = frontend.try_node().await.unwrap_or_default();
    let ids = node["members"].as_array().into_iter().flatten().filter_map(|m| m["id"].as_str().map(String::from));
    (node["leader"]["addr"].clone(), ids.collect())
}

#[tokio::test]
async fn without_a_client_certificate_etcdctl_cannot_take_over_the_leader_or_add_members() {
    let etcd = Etcd::start().await;
    let endpoint = etcd.endpoint();
    let config = temp_dir_with(&[]);
    let ingest = Meshpilot::ingest(&endpoint, config.path()).id("ingest-real").lease_ttl(2).start();
    let frontend = Meshpilot::frontend(&endpoint).id("fe-real").lease_ttl(2).start();
    let real = ingest.snapshot_addr().to_string();
    let follows_real = frontend
        .wait_for(STARTUP_TIMEOUT, async |f| {
            let (leader, members) = followed(f).await;
            leader == real.as_str() && members == ["fe-real"]
        })
        .await;
    assert!(follows_real, "the frontend never followed the real leader: {}", frontend.node().await);

    // The leader's key and lease, as whoever holds the client certificate sees them.
    let trusted = endpoint.etcdctl_args();
    let (ok, keys) = etcdctl(&trusted, &["get", "--prefix", "--keys-only", DEFAULT_ELECTION_NAME]).await;
    assert!(ok, "etcdctl with the client certificate: {keys}");
    let leader_key = keys.lines().find(|l| !l.is_empty()).expect("the leader's election key").to_string();
    let lease = leader_key.rsplit('/').next().expect("the key ends in its lease id").to_string();
    let rogue = free_port();
    let rogue_key = format!("{DEFAULT_ELECTION_NAME}/1");
    let rogue_addr = format!("127.0.0.1:{rogue}");
    let fake_member = format!("{DEFAULT_PREFIX}fe-rogue");

    // The attacker trusts etcd's certificate (or skips checking it) but has no client certificate.
    let no_cert = |extra: &str| {
        let ca = endpoint.tls.ca.as_ref().expect("the CA file").display();
        vec![format!("--endpoints={}", endpoint.url), extra.replace("{ca}", &ca.to_string())]
    };
    for attacker in [no_cert("--cacert={ca}"), no_cert("--insecure-skip-tls-verify")] {
        let attacks: [&[&str]; 3] =
            [&["lease", "revoke", &lease], &["put", &rogue_key, &rogue_addr], &["put", &fake_member, &rogue_addr]];
        for attack in attacks {
            let (ok, out) = etcdctl(&attacker, attack).await;
            assert!(!ok, "etcdctl {attacker:?} {attack:?} got in: {out}");
        }
    }
    // The same put with the client certificate does land (the attack's commands are right):
    // proved on a key nobody reads.
    let (ok, out) = etcdctl(&trusted, &["put", "/meshpilot-test/probe", &rogue_addr]).await;
    assert!(ok, "etcdctl with the client certificate could not put: {out}");

    // Nothing changed: the frontend follows the real leader, with itself as the only member.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (leader, members) = followed(&frontend).await;
    assert_eq!(leader, real.as_str(), "the frontend follows another leader");
    assert_eq!(members, ["fe-real"], "members changed");
    let (ok, keys) = etcdctl(&trusted, &["get", "--prefix", "--keys-only", DEFAULT_ELECTION_NAME]).await;
    assert!(ok && keys.lines().find(|l| !l.is_empty()) == Some(leader_key.as_str()), "election keys: {keys}");
    assert!(ingest.is_leader().await, "the real leader lost its lead:\n{}", ingest.logs());
}

/// Waits for `node` to exit; its exit status and log.
async fn exit_of(node: &Meshpilot) -> (std::process::ExitStatus, String) {
    let exited = poll(STARTUP_TIMEOUT, async || node.exit_status()).await;
    let status = exited.unwrap_or_else(|| panic!("{} still runs:\n{}", node.label(), node.logs()));
    (status, node.logs())
}

#[tokio::test]
async fn meshpilot_refuses_plaintext_etcd_or_tls_without_a_client_certificate_unless_insecure() {
    let plain = Etcd::start_plaintext().await;
    let config = temp_dir_with(&[]);
    // `--etcd-endpoints http://...` alone: both roles exit at once, saying what to pass.
    let ingest = Meshpilot::ingest(plain.url(), config.path()).start();
    let frontend = Meshpilot::frontend(plain.url()).start();
    for node in [&ingest, &frontend] {
        let (status, logs) = exit_of(node).await;
        assert!(!status.success(), "{} exited with {status}", node.label());
        for said in ["is plaintext", "--etcd-cert", "--insecure-etcd"] {
            assert!(logs.contains(said), "{} did not say {said:?}:\n{logs}", node.label());
        }
    }
    // https:// with only the CA (no client certificate): refused too.
    let secure = Etcd::start().await;
    let ca = secure.endpoint().tls.ca.expect("the CA file").display().to_string();
    let server_only = Meshpilot::frontend(secure.url()).arg("--etcd-cacert").arg(&ca).start();
    let (status, logs) = exit_of(&server_only).await;
    assert!(!status.success(), "exited with {status}");
    assert!(logs.contains("--etcd-cert and --etcd-key") && logs.contains("--insecure-etcd"), "{logs}");

    // With --insecure-etcd (the harness adds it for a plaintext etcd) it runs, and warns.
    let insecure: EtcdEndpoint = plain.endpoint();
    assert!(insecure.meshpilot_args().contains(&"--insecure-etcd".to_string()));
    let accepted = Meshpilot::ingest(&insecure, config.path()).start();
    let leads = accepted.wait_for(STARTUP_TIMEOUT, async |n| n.is_leader().await).await;
    assert!(leads, "an --insecure-etcd ingest node did not lead:\n{}", accepted.logs());
    let logs = accepted.logs();
    assert!(logs.contains("WARN") && logs.contains("--insecure-etcd"), "no warning:\n{logs}");
}

#[tokio::test]
async fn the_certificates_of_deploy_etcd_certs_sh_let_meshpilot_in_and_nobody_without_them() {
    // etcd as deploy/kustomize/base/etcd.yaml runs it, with the script's certificates
    // (127.0.0.1 is among their names, for etcdctl in the pod and run-local.sh).
    let dir = temp_dir("meshpilot-etcd-certs-");
    let pki = dir.path().join("pki");
    let made = std::process::Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/etcd-certs.sh"))
        .arg(&pki)
        .status()
        .expect("bash runs");
    assert!(made.success(), "deploy/etcd-certs.sh failed: {made}");
    let file = |name: &str| pki.join(name).display().to_string();
    let endpoint = format!("https://127.0.0.1:{}", free_port());
    let peer = format!("https://127.0.0.1:{}", free_port());
    let mut spec = ProcessSpec::new("etcd (deploy certificates)", "etcd")
        .args(["--data-dir".to_string(), dir.path().join("data").display().to_string()])
        .args(["--name", "default"])
        .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
        .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
        .args(["--initial-cluster".to_string(), format!("default={peer}")])
        .log_tail(60, 60);
    for prefix in ["--", "--peer-"] {
        spec = spec.args([
            format!("{prefix}cert-file={}", file("server.crt")),
            format!("{prefix}key-file={}", file("server.key")),
            format!("{prefix}trusted-ca-file={}", file("ca.crt")),
            format!("{prefix}client-cert-auth"),
        ]);
    }
    let etcd = Process::start(dir, spec);
    let endpoints = vec![endpoint.clone()];
    let client = EtcdTls {
        ca: Some(file("ca.crt").into()),
        cert: Some(file("client.crt").into()),
        key: Some(file("client.key").into()),
        insecure: false,
    };
    let served = etcd
        .poll_while_running(STARTUP_TIMEOUT, async || {
            let Ok(mut c) = connect_with_tls(&endpoints, &client).await else { return false };
            matches!(tokio::time::timeout(Duration::from_secs(2), c.put("/probe", "x", None)).await, Ok(Ok(_)))
        })
        .await;
    assert!(served, "meshpilot's client certificate was not accepted:\n{}", etcd.logs());
    // etcdctl with only the CA is refused; with the client certificate it gets in.
    let ca_only = [format!("--endpoints={endpoint}"), format!("--cacert={}", file("ca.crt"))];
    let (ok, out) = etcdctl(&ca_only, &["put", "/meshpilot/frontends/rogue", "127.0.0.1:1"]).await;
    assert!(!ok, "etcdctl without a client certificate wrote: {out}");
    let (ok, out) = etcdctl(&[ca_only.to_vec(), client_args(&file)].concat(), &["get", "/probe"]).await;
    assert!(ok && out.contains('x'), "etcdctl with the client certificate: {out}");
}

/// etcdctl's `--cert/--key` for the script's client certificate.
fn client_args(file: &dyn Fn(&str) -> String) -> Vec<String> {
    vec![format!("--cert={}", file("client.crt")), format!("--key={}", file("client.key"))]
}

#[tokio::test]
async fn a_member_id_and_a_leader_address_from_etcd_reach_the_log_escaped_and_capped() {
    // Whoever writes etcd (here with the client certificate, as a stolen one would) chooses the
    // member ids and the leader's address that frontends log (issue 27, finding 10).
    let etcd = Etcd::start().await;
    let endpoint = etcd.endpoint();
    let config = temp_dir_with(&[]);
    let mut ingest = Meshpilot::ingest(&endpoint, config.path()).id("ingest-real").lease_ttl(2).start();
    // Text logs: a raw newline in a field would start a line of the attacker's.
    let frontend =
        Meshpilot::frontend(&endpoint).id("fe-real").lease_ttl(2).env("MESHPILOT_LOG_FORMAT", "text").start();
    let real = ingest.snapshot_addr().to_string();
    let follows = frontend.wait_for(STARTUP_TIMEOUT, async |f| followed(f).await.0 == real.as_str()).await;
    assert!(follows, "the frontend never followed the real leader:\n{}", frontend.logs());

    let forged = format!("x\nFORGED-LINE ERROR meshpilot: {}", "y".repeat(20_000));
    let trusted = endpoint.etcdctl_args();
    let (ok, out) = etcdctl(&trusted, &["put", &format!("{DEFAULT_PREFIX}fe-{forged}"), "127.0.0.1:1"]).await;
    assert!(ok, "etcdctl put member: {out}");
    // The leader's key lapses with its killed node; then a key of the attacker's leads.
    ingest.kill();
    let lapsed = poll(STARTUP_TIMEOUT, async || {
        let (ok, keys) = etcdctl(&trusted, &["get", "--prefix", "--keys-only", DEFAULT_ELECTION_NAME]).await;
        ok && keys.trim().is_empty()
    })
    .await;
    assert!(lapsed, "the killed leader's key did not lapse");
    let (ok, out) = etcdctl(&trusted, &["put", &format!("{DEFAULT_ELECTION_NAME}/rogue"), &forged]).await;
    assert!(ok, "etcdctl put leader: {out}");

    let logged = frontend
        .wait_for(STARTUP_TIMEOUT, async |f| {
            let logs = f.logs();
            logs.lines().any(|l| l.contains("members changed") && l.contains("count=2"))
                && logs.lines().any(|l| l.contains("leader value is not an address") && l.contains("FORGED-LINE"))
        })
        .await;
    assert!(logged, "the frontend did not log the new members and leader:\n{}", frontend.log_tail(20));
    let logs = frontend.logs();
    for line in logs.lines() {
        assert!(!line.starts_with("FORGED-LINE"), "a line forged through etcd: {line}");
        assert!(line.len() < 2_000, "an uncapped line ({} bytes): {}…", line.len(), &line[..200]);
    }
    assert!(logs.contains("x\\nFORGED-LINE"), "the newline is not shown escaped:\n{}", frontend.log_tail(10));
    // Nobody dials the rogue value: there is no leader rather than that one.
    assert!(logs.lines().any(|l| l.contains("INFO no leader")), "{}", frontend.log_tail(10));
}
