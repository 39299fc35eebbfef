//! The scale-out system end to end on 127.0.0.1 (see [`common::cluster`]): config changes reach
//! every proxy through the load balancer, and traffic and configuration survive a leader killed
//! during edits, a frontend killed, an etcd outage, a rolling restart of the frontends and
//! membership changes.
//!
//! The tests are heavy: run them one at a time (`--test-threads=1`); they also take a lock so
//! that two never overlap when run with more threads.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::cluster::files::MeshState;
use common::cluster::monitors::{TermMonitor, Traffic};
use common::cluster::sims::{connect_sim, sim_names, sim_problem, sim_spec};
use common::cluster::*;
use common::config_dump::{assert_same_dynamic_config, dynamic_resources, dynamic_route_config, endpoint_ports};
use common::envoy::Envoy;
use common::mesh::{GATEWAY_NODE_ID, SIDECAR_NODE_ID};
use common::meshpilot::{applied_versions, operator_command, wait_leader, Meshpilot};
use common::poll::{poll, STARTUP_TIMEOUT};
use common::process::TERMINATE_GRACE;
use meshpilot::sim::SimProxy;
use meshpilot::snapshot::Version;
use meshpilot::xds::TypeUrl;
use serde_json::Value;

/// ≥ 500 simulated proxies over three namespaces and two real Envoys, all through the load
/// balancer: everything converges; then a change (a new endpoint for reviews, and both
/// VirtualServices routing to it) reaches every proxy, and traffic follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_change_reaches_every_proxy() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 84 }).await;
    assert!(c.sims.len() >= 500, "{} simulated proxies", c.sims.len());

    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v1a", 5).await;
    c.sidecar_ingress().wait_all_from("/", &[], "reviews-v1a", 5).await;
    c.assert_ownership_agrees().await;
    eprintln!("converged on {v0} at {:?}", t0.elapsed());

    let changed = MeshState { route: "to-v2".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    assert!(v1 > v0);
    c.wait_converged(v1).await;
    eprintln!("{} simulated proxies and 2 Envoys on {v1} at {:?}", c.sims.len(), t0.elapsed());

    // Every simulated proxy received the new endpoint (EDS) and route (RDS) versions. The
    // services are written before the routes, and each write may be its own snapshot: the routes
    // change in `v1` (the first snapshot holding them), the endpoints in `v1` or one before it,
    // and a proxy is sent a type only in a snapshot that changes it.
    for s in &c.sims {
        let state = s.proxy.state();
        let acked = |t: TypeUrl| state.types[&t].acked_version.parse::<Version>().ok();
        let (eds, rds) = (acked(TypeUrl::Endpoint), acked(TypeUrl::Route));
        assert!(eds.is_some_and(|a| a > v0), "{}: EDS acked {eds:?}, want after {v0}", s.spec.node_id);
        assert!(rds.is_some_and(|a| a >= v1), "{}: RDS acked {rds:?}, want {v1}", s.spec.node_id);
    }
    let route_port = c.files.sidecar_port.to_string();
    for (envoy, route) in [(&c.gateway, format!("http.{}", c.files.gw_port)), (&c.sidecar, route_port)] {
        let dump = envoy.config_dump().await;
        let rc = dynamic_route_config(&dump, &route)
            .unwrap_or_else(|| panic!("{}: no route config {route}", envoy.node_id()));
        assert!(
            rc.to_string().contains("\"to-v2\""),
            "{}: route config {route} lacks the new route: {rc:#}",
            envoy.node_id()
        );
        let cluster = format!("outbound|{}|v2|reviews.{SHOP}.svc.cluster.local", c.files.sidecar_port);
        assert_eq!(
            endpoint_ports(&dump, &cluster),
            Some(vec![u64::from(c.backends.v2.port())]),
            "{}: endpoints of {cluster}",
            envoy.node_id()
        );
    }
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    c.sidecar_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    eprintln!("config_change_reaches_every_proxy: {:?}", t0.elapsed());
}

/// Operator commands pointed at any one node cover every frontend through membership: the ingest
/// leader's and one frontend's `meshpilot proxy-status` both list the proxies of both frontends,
/// each with the frontend serving it, and `meshpilot proxy-config` pointed at one frontend shows a
/// proxy another frontend holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_commands_reach_every_frontend() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 2 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    let ids = c.frontend_ids();
    let (leader, _) = c.leader().await;
    for node in [&c.ingests[leader], &c.frontends[0]] {
        let (ok, out, err) = operator_command(node, &["proxy-status"]).await;
        assert!(ok, "proxy-status against {} failed:\n{out}\n{err}", node.id());
        for (node_id, owner) in [(GATEWAY_NODE_ID, &ids[0]), (SIDECAR_NODE_ID, &ids[1])] {
            let line = out.lines().find(|l| l.starts_with(node_id)).unwrap_or_default();
            let cells: Vec<&str> = line.split_whitespace().collect();
            let frontend = format!("frontend/{owner}");
            let synced = ["SYNCED", "SYNCED", "SYNCED", "SYNCED", frontend.as_str()];
            assert_eq!(cells.get(1..6), Some(&synced[..]), "{node_id} as seen from {}:\n{out}", node.id());
        }
        let listed = out.lines().skip(1).filter(|l| !l.trim().is_empty()).count();
        assert_eq!(listed, c.sims.len() + 2, "every proxy of every frontend, from {}:\n{out}", node.id());
    }
    let (ok, out, err) = operator_command(&c.frontends[0], &["proxy-config", "clusters", SIDECAR_NODE_ID]).await;
    let reviews = format!("reviews.{SHOP}.svc.cluster.local");
    assert!(ok && out.contains(&reviews), "proxy-config of {}'s proxy through {}:\n{out}\n{err}", ids[1], ids[0]);
}

/// Config edits at > 10/s for > 10 s with traffic through the gateway and sidecar; the leader is
/// killed (-9) in the middle. A standby takes over with a higher term, no request fails, no
/// frontend goes back to an older version or term, and at the end every proxy holds exactly what a
/// fresh standalone meshpilot serves for the final files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_during_edits() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 10 }).await;
    let both = MeshState { route: "both".into(), weights: (50, 50), endpoints: (true, true, true) };
    let v0 = c.apply(&both).await;
    c.wait_converged(v0).await;
    let (old_leader, old_term) = c.leader().await;

    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;
    sc.wait_progress(20).await;
    let monitor = TermMonitor::start(&c.frontends);

    // The edit stream: every 80 ms the routes (name, weights) and every other time the endpoints
    // of v1 (always one or two live backends), for 11 s; the leader dies after 5 s.
    let edits_started = Instant::now();
    let mut killed_at = None;
    let mut edits: u32 = 0;
    let v1_sets = [(true, false), (true, true), (false, true)];
    while edits_started.elapsed() < Duration::from_secs(11) {
        let w = 10 + (edits * 7) % 81;
        let (a, b) = v1_sets[(edits / 2) as usize % v1_sets.len()];
        let state = MeshState { route: format!("edit-{edits}"), weights: (w, 100 - w), endpoints: (a, b, true) };
        c.files.write_routes(c.dir(), &state);
        if edits.is_multiple_of(2) {
            c.files.write_services(c.dir(), &c.backends, &state);
        }
        edits += 1;
        if killed_at.is_none() && edits_started.elapsed() >= Duration::from_secs(5) {
            c.ingests[old_leader].kill();
            killed_at = Some(edits_started.elapsed());
            eprintln!("killed leader {} (term {old_term}) after {edits} edits", c.ingests[old_leader].id());
        }
        tokio::time::sleep_until((edits_started + Duration::from_millis(80) * edits).into()).await;
    }
    let rate = edits as f64 / edits_started.elapsed().as_secs_f64();
    eprintln!("{edits} edits in {:?} ({rate:.1}/s)", edits_started.elapsed());
    assert!(edits >= 100 && rate >= 10.0, "{edits} edits at {rate:.1}/s");
    let last = MeshState { route: "final".into(), weights: (30, 70), endpoints: (true, true, true) };
    c.files.write_services(c.dir(), &c.backends, &last);
    c.files.write_routes(c.dir(), &last);

    let (new_leader, new_term) = wait_leader(&c.ingests, TIMEOUT, |t| t > old_term).await;
    assert_ne!(new_leader, old_leader);
    eprintln!("new leader {} term {new_term}", c.ingests[new_leader].id());
    let v_final = c.wait_leader_has(&last).await;
    assert_eq!(v_final.term, new_term);
    c.wait_converged(v_final).await;
    gw.wait_progress(20).await;
    let gw_ok = gw.finish(200).await;
    let sc_ok = sc.finish(200).await;
    monitor.finish().await;

    // Frontends: on the new term, never applied an older version than one applied before.
    for f in &c.frontends {
        let node = f.node().await;
        let held: Version = node["held"].as_str().unwrap().parse().unwrap();
        assert_eq!(held.term, new_term, "{}: {node:#}", f.id());
        assert_eq!(node["highest_term"], new_term, "{}: {node:#}", f.id());
        let runs = applied_versions(&f.logs());
        assert_eq!(runs.len(), 1, "{} restarted", f.id());
        let applied = &runs[0];
        assert!(applied.iter().any(|v| v.term == old_term) && applied.iter().any(|v| v.term == new_term));
        for w in applied.windows(2) {
            assert!(w[0] < w[1], "{} applied {} after {}: {applied:?}", f.id(), w[1], w[0]);
        }
        eprintln!(
            "{}: applied {} snapshots ({} fulls, {} deltas), refused {} of a lower term, {} resyncs",
            f.id(),
            applied.len(),
            node["fulls_applied"],
            node["deltas_applied"],
            node["refused_lower_term"],
            node["resyncs"]
        );
    }

    // The final state, as a fresh standalone meshpilot serves it to fresh proxies.
    let reference = Meshpilot::standalone(c.dir()).start();
    reference.wait_ready(STARTUP_TIMEOUT).await;
    let fresh_gateway =
        Envoy::builder(GATEWAY_NODE_ID, reference.xds_addr()).metadata(gateway_metadata(&c.gateway_sa)).start();
    let fresh_sidecar =
        Envoy::builder(SIDECAR_NODE_ID, reference.xds_addr()).metadata(sidecar_metadata(&c.sidecar_sa)).start();
    fresh_gateway.wait_ready(STARTUP_TIMEOUT).await;
    fresh_sidecar.wait_ready(STARTUP_TIMEOUT).await;
    let (status, body) = reference.admin_get("/debug/push_status").await;
    assert_eq!(status, 200, "{body}");
    for (envoy, fresh) in [(&c.gateway, &fresh_gateway), (&c.sidecar, &fresh_sidecar)] {
        // The fresh Envoy may still be receiving EDS/RDS: poll until equal or timeout.
        let mut got = Value::Null;
        let mut want = Value::Null;
        let same = poll(TIMEOUT, async || {
            got = envoy.config_dump().await;
            want = fresh.config_dump().await;
            dynamic_resources(&got) == dynamic_resources(&want)
        })
        .await;
        assert_same_dynamic_config(envoy.node_id(), &got, &want);
        assert!(same);
    }
    let mut fresh_sims: BTreeMap<String, SimProxy> = BTreeMap::new();
    for k in &c.keys {
        let spec = sim_spec(&format!("http://{}", reference.xds_addr()), k, 90_000 + fresh_sims.len());
        let sim = connect_sim(spec).await;
        assert!(
            sim.wait_for(TIMEOUT, |s| sim_problem(s, None).is_none()).await,
            "fresh simulated proxy of {}",
            k.key()
        );
        fresh_sims.insert(k.key(), sim);
    }
    for s in &c.sims {
        let want = sim_names(&fresh_sims[&s.key].state());
        let got = sim_names(&s.proxy.state());
        assert_eq!(got, want, "{}: resource names differ from a fresh simulated proxy on standalone", s.spec.node_id);
    }
    c.gateway_ingress().wait_backend("/", &[], "reviews-v2").await;
    eprintln!(
        "leader_kill_during_edits: {:?} (killed at {killed_at:?}; {gw_ok} gateway and {sc_ok} sidecar requests)",
        t0.elapsed()
    );
}

/// A frontend is killed (-9): the Envoy it served reconnects through the load balancer to the
/// other one and converges there; traffic never fails; membership drops to 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frontend_kill_moves_proxies() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 0 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    let (gw_on, sc_on) = c.wait_envoys_synced(v0).await;
    let ids = c.frontend_ids();
    assert_eq!((gw_on.as_str(), sc_on.as_str()), (ids[0].as_str(), ids[1].as_str()), "Envoys where the ring puts them");

    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;

    let killed_at = Instant::now();
    c.frontends[0].kill();
    let survivor = &c.frontends[1];
    let mut listed = Vec::new();
    let ok = survivor
        .wait_for(TIMEOUT, async |_| {
            listed = survivor.connected_proxies().await;
            listed.iter().any(|p| p == GATEWAY_NODE_ID)
        })
        .await;
    assert!(ok, "{} does not list the gateway after {TIMEOUT:?}: {listed:?}", survivor.id());
    eprintln!("gateway moved to {} in {:?}", survivor.id(), killed_at.elapsed());
    let (gw_on, sc_on) = c.wait_envoys_synced(v0).await;
    assert_eq!((gw_on.as_str(), sc_on.as_str()), (ids[1].as_str(), ids[1].as_str()));
    c.lb.wait_healthy(1, TIMEOUT).await;
    wait_members(&c.frontends[1..], 1).await;
    assert!(survivor.node().await["ownership"]["foreign"] == 0);

    // The moved gateway still gets updates: route everything to v2.
    let changed = MeshState { route: "to-v2".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    c.wait_envoys_synced(v1).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    gw.wait_progress(20).await;
    gw.finish(100).await;
    sc.finish(100).await;
    eprintln!("frontend_kill_moves_proxies: {:?}", t0.elapsed());
}

/// etcd is killed for ~10 s: frontends keep serving (traffic, unchanged config, a new simulated
/// proxy gets the full config), the leader steps down; after etcd returns a leader is elected,
/// frontends register again, and a change made then reaches the proxies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_outage() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 5 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    let (_, old_term) = c.leader().await;
    let before: Vec<Value> =
        vec![dynamic_resources(&c.gateway.config_dump().await), dynamic_resources(&c.sidecar.config_dump().await)];
    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;

    c.etcd.kill();
    let outage = Instant::now();
    eprintln!("etcd killed");
    // The leader steps down once its lease cannot be kept (no leader while etcd is away).
    let mut leaders = Vec::new();
    let stepped_down = poll(TIMEOUT, async || {
        leaders.clear();
        for n in &c.ingests {
            // Unreachable counts as not stepped down.
            let node = n.try_node().await;
            if node.as_ref().is_none_or(|n| n["leader"] != false) {
                leaders.push(format!("{}: {node:?}", n.id()));
            }
        }
        leaders.is_empty()
    })
    .await;
    assert!(stepped_down, "still leading without etcd: {leaders:?}");
    eprintln!("leader stepped down {:?} into the outage", outage.elapsed());
    // Frontends keep serving their snapshot, also to a proxy that connects now.
    for (i, f) in c.frontends.iter().enumerate() {
        assert_eq!(f.try_admin_get("/ready").await.map(|r| r.0).ok(), Some(200), "{} not ready", f.id());
        let held = f.held().await.expect("held");
        assert_eq!(held, v0, "{} changed snapshot during the outage", f.id());
        let key = c.keys.iter().find(|k| k.owner == f.id()).unwrap();
        let sim = connect_sim(sim_spec(&f.xds_url(), key, 80_000 + i)).await;
        assert!(
            sim.wait_for(TIMEOUT, |s| sim_problem(s, Some(v0)).is_none()).await,
            "a new simulated proxy on {} during the outage: {:?}",
            f.id(),
            sim.state()
        );
        let peer = c.sims.iter().find(|s| s.key == key.key()).unwrap();
        assert_eq!(sim_names(&sim.state()), sim_names(&peer.proxy.state()), "config of a new proxy on {}", f.id());
    }
    let remaining = Duration::from_secs(10).saturating_sub(outage.elapsed());
    tokio::time::sleep(remaining).await;
    assert_eq!(
        dynamic_resources(&c.gateway.config_dump().await),
        before[0],
        "gateway config changed during the outage"
    );
    assert_eq!(
        dynamic_resources(&c.sidecar.config_dump().await),
        before[1],
        "sidecar config changed during the outage"
    );
    gw.wait_progress(20).await;

    c.etcd.restart().await;
    eprintln!("etcd back after {:?}", outage.elapsed());
    let (_, new_term) = wait_leader(&c.ingests, TIMEOUT, |t| t > old_term).await;
    wait_members(&c.frontends, 2).await;
    eprintln!(
        "leader elected (term {new_term}) and frontends registered {:?} after the outage began",
        outage.elapsed()
    );

    let changed = MeshState { route: "after-outage".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    assert_eq!(v1.term, new_term);
    c.wait_converged(v1).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    c.sidecar_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    gw.finish(200).await;
    sc.finish(200).await;
    eprintln!("etcd_outage: {:?}", t0.elapsed());
}

/// Each frontend in turn is stopped (SIGTERM) and started again on the same ports, the next only
/// once it is ready: no request through the Envoys fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_of_frontends() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 2, apps_per_frontend: 1, sims_per_key: 0 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_envoys_synced(v0).await;
    let gw = Traffic::start("gateway", c.gateway_ingress());
    let sc = Traffic::start("sidecar", c.sidecar_ingress());
    gw.wait_progress(20).await;
    sc.wait_progress(20).await;

    let mut slow_exits = Vec::new();
    for i in 0..c.frontends.len() {
        let stopped_at = Instant::now();
        let graceful = c.frontends[i].terminate(TERMINATE_GRACE).await;
        if !graceful {
            slow_exits.push(format!("{} did not exit within {TERMINATE_GRACE:?} of SIGTERM", c.frontends[i].id()));
        }
        eprintln!("{} stopped in {:?} (graceful: {graceful})", c.frontends[i].id(), stopped_at.elapsed());
        c.frontends[i].restart();
        c.frontends[i].wait_ready(STARTUP_TIMEOUT).await;
        wait_members(&c.frontends, 2).await;
        c.lb.wait_healthy(2, TIMEOUT).await;
        c.wait_envoys_synced(v0).await;
        gw.wait_progress(20).await;
        sc.wait_progress(20).await;
    }
    // Still programmable after the restarts.
    let changed = MeshState { route: "after-restarts".into(), weights: (0, 100), endpoints: (true, false, true) };
    let v1 = c.apply(&changed).await;
    c.wait_envoys_synced(v1).await;
    c.gateway_ingress().wait_all_from("/", &[], "reviews-v2", 10).await;
    gw.finish(100).await;
    sc.finish(100).await;
    assert!(slow_exits.is_empty(), "{slow_exits:?}");
    eprintln!("rolling_restart_of_frontends: {:?}", t0.elapsed());
}

/// With the load balancer in front, every proxy (Envoys sending their key as gRPC metadata,
/// simulated proxies through keyed listeners) lands on the frontend the load balancer routes its
/// key to, and that frontend reports it as owned: the load balancer and the frontends agree on the
/// hash. Three frontends, two keys per namespace per frontend. Then a frontend dies and comes back:
/// after each membership change, proxies that connect anew are again owned where they land
/// (proxies that stayed may now count as foreign: long-lived streams are not rebalanced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_stability_across_membership() {
    let _serial = SERIAL.lock().await;
    let t0 = Instant::now();
    let mut c = Cluster::start(Options { frontends: 3, apps_per_frontend: 2, sims_per_key: 3 }).await;
    let v0 = c.wait_leader_has(&MeshState::initial()).await;
    c.wait_converged(v0).await;
    c.assert_ownership_agrees().await;
    for f in &c.frontends {
        let o = &f.node().await["ownership"];
        eprintln!("{}: owned {} foreign {}", f.id(), o["owned"], o["foreign"]);
    }

    // Membership 3 → 2.
    c.frontends[2].kill();
    c.lb.wait_healthy(2, TIMEOUT).await;
    wait_members(&c.frontends[..2], 2).await;
    let after_leave = assert_new_proxies_owned(&c, 50_000).await;
    eprintln!("2 members: {:?}", ownership_counts(&c.frontends).await);

    // Membership 2 → 3.
    c.frontends[2].restart();
    c.frontends[2].wait_ready(STARTUP_TIMEOUT).await;
    c.lb.wait_healthy(3, TIMEOUT).await;
    wait_members(&c.frontends, 3).await;
    let after_join = assert_new_proxies_owned(&c, 60_000).await;
    eprintln!("3 members again: {:?}", ownership_counts(&c.frontends).await);
    drop((after_leave, after_join));
    eprintln!("hash_stability_across_membership: {:?}", t0.elapsed());
}
