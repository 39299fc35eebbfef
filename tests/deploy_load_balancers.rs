//! The load balancers hash proxies as the frontends' ownership (Maglev) does: statically (the
//! shipped bootstraps, `deploy/local/run-local.sh`), and for Kubernetes end to end, with a real
//! Envoy resolving a stub DNS name to several frontends.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::process::Command;

use common::backend::Backend;
use common::deploy::bootstraps::{frontend_container, hashing_problems, named, proxy_bootstrap_problems};
use common::deploy::cli::{parse_cli, port_of, run_local_command_lines};
use common::deploy::workloads::{generated_file, selects, workloads};
use common::deploy::*;
use common::dns::StubDns;
use common::envoy::Envoy;
use common::http::{http_client, http_request};
use common::poll::STARTUP_TIMEOUT;
use common::ports::{free_addr, free_port, port_free_on};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use meshpilot::cluster::ownership::{Maglev, MaglevSettings, Ownership, ProxyHashing, PROXY_KEY_HEADER};
use serde_json::json;

#[test]
fn kubernetes_load_balancer_hashes_frontends_by_address_as_they_name_themselves() {
    let base = load_base();
    let workloads = workloads(&base.manifests);
    let ns = &base.namespace;
    let (frontend, container, cli) = frontend_container(&workloads);
    let mut problems = Vec::new();

    // The frontends' member id is their address, which is what Envoy hashes STRICT_DNS hosts by.
    let xds_port = cli.flags.get("--xds-addr").and_then(|a| port_of(a)).expect("frontend --xds-addr with a port");
    let own_addr = format!("$(POD_IP):{xds_port}");
    for flag in ["--id", "--advertise-addr"] {
        if cli.flags.get(flag) != Some(&own_addr) {
            problems.push(format!("frontend {flag} is {:?}, must be {own_addr}", cli.flags.get(flag)));
        }
    }
    let pod_ip = container.env.iter().flatten().find(|e| e.name == "POD_IP");
    let field = pod_ip.and_then(|e| e.value_from.as_ref()).and_then(|f| f.field_ref.as_ref());
    if field.map(|f| f.field_path.as_str()) != Some("status.podIP") {
        problems.push("frontend env POD_IP must come from status.podIP".into());
    }

    // The LB resolves the frontends' headless Service.
    let services: Vec<&Service> =
        base.manifests.iter().filter_map(|m| if let Object::Service(s) = &m.object { Some(s) } else { None }).collect();
    let frontend_service = services
        .iter()
        .find(|s| {
            let selector =
                LabelSelector { match_labels: s.spec.as_ref().and_then(|x| x.selector.clone()), ..Default::default() };
            selects(&selector, &frontend.labels()).unwrap_or(false)
        })
        .expect("a Service selecting the frontends");
    let spec = frontend_service.spec.as_ref().expect("frontend Service spec");
    if spec.cluster_ip.as_deref() != Some("None") || spec.publish_not_ready_addresses == Some(true) {
        problems.push("the frontend Service must be headless and list ready pods only".into());
    }
    let service_port = spec.ports.iter().flatten().find(|p| p.port == i32::from(xds_port));
    if service_port.is_none() {
        problems.push(format!("the frontend Service has no port {xds_port}"));
    }

    let lb_path = generated_file(&base, "meshpilot-xds-lb-bootstrap", "xds-lb.yaml");
    let lb = yaml_value(&lb_path);
    let what = shown(&lb_path);
    problems.extend(hashing_problems(&lb, &what));
    let cluster = named(&lb["static_resources"]["clusters"], "frontends", &what);
    let dns = &cluster["cluster_type"];
    if dns["name"] != "envoy.clusters.dns"
        || dns["typed_config"]["all_addresses_in_single_endpoint"] != false
        || dns["typed_config"]["dns_lookup_family"] != "V4_ONLY"
    {
        problems.push(format!("{what}: frontends must be strict DNS (one host per address), IPv4: {dns}"));
    }
    let endpoints = &cluster["load_assignment"]["endpoints"][0]["lb_endpoints"];
    let expected = json!([{"endpoint": {"address": {"socket_address": {
        "address": format!("{}.{ns}.svc", frontend_service.metadata.name.as_deref().unwrap_or_default()),
        "port_value": xds_port
    }}}}]);
    if *endpoints != expected {
        problems.push(format!("{what}: lb_endpoints {endpoints} should be exactly {expected} (no hash_key metadata)"));
    }

    // Proxies reach the LB Service and send their key.
    let sidecar_path = generated_file(&base, "meshpilot-example-sidecar-bootstrap", "sidecar-bootstrap.yaml");
    let (more, (host, port)) = proxy_bootstrap_problems(&yaml_value(&sidecar_path), &shown(&sidecar_path));
    problems.extend(more);
    let lb_service =
        services.iter().find(|s| s.metadata.name.as_deref() == Some("meshpilot-xds")).expect("Service meshpilot-xds");
    let lb_ports: Vec<i32> = lb_service.spec.iter().flat_map(|s| s.ports.iter().flatten()).map(|p| p.port).collect();
    if host != format!("meshpilot-xds.{ns}.svc") || !lb_ports.contains(&i32::try_from(port).unwrap_or(-1)) {
        problems.push(format!("{}: the xds cluster points at {host}:{port}, not meshpilot-xds", shown(&sidecar_path)));
    }
    assert_no_problems("Kubernetes load balancer", &problems);
}

#[test]
fn local_load_balancer_hashes_the_frontend_ids_run_local_starts() {
    let lb_path = local_dir().join("xds-lb.yaml");
    let lb = yaml_value(&lb_path);
    let what = shown(&lb_path);
    let mut problems = hashing_problems(&lb, &what);

    // Frontends run-local.sh starts: id → xDS port.
    let mut frontends = BTreeMap::new();
    for (line, args) in run_local_command_lines() {
        match parse_cli(&args) {
            Ok(cli) if cli.subcommand == "frontend" => {
                let id = cli.flags.get("--id").cloned().unwrap_or_default();
                let port = cli.flags.get("--xds-addr").and_then(|a| port_of(a));
                frontends.insert(id, port);
            }
            Ok(_) => {}
            Err(e) => problems.push(format!("run-local.sh line {line}: {e:?}")),
        }
    }
    let cluster = named(&lb["static_resources"]["clusters"], "frontends", &what);
    let mut endpoints = BTreeMap::new();
    for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"].as_array().into_iter().flatten() {
        let id = e["metadata"]["filter_metadata"]["envoy.lb"]["hash_key"].as_str().unwrap_or_default().to_string();
        let port =
            e["endpoint"]["address"]["socket_address"]["port_value"].as_u64().and_then(|p| u16::try_from(p).ok());
        endpoints.insert(id, port);
    }
    if endpoints != frontends {
        problems
            .push(format!("{what}: endpoints (hash_key → port) {endpoints:?} != run-local.sh frontends {frontends:?}"));
    }
    let (more, (host, port)) =
        proxy_bootstrap_problems(&yaml_value(&local_dir().join("envoy-sidecar.yaml")), "envoy-sidecar.yaml");
    problems.extend(more);
    let listener = named(&lb["static_resources"]["listeners"], "xds", &what);
    let socket = &listener["address"]["socket_address"];
    if socket["address"] != host || socket["port_value"] != port {
        problems.push(format!("deploy/local/envoy-sidecar.yaml connects to {host}:{port}, the LB listens on {socket}"));
    }
    assert_no_problems("local load balancer", &problems);
}

#[test]
fn run_local_script_is_valid_bash_and_starts_every_component() {
    let script = local_dir().join("run-local.sh");
    let out = Command::new("bash").arg("-n").arg(&script).output().expect("run bash -n");
    assert!(out.status.success(), "bash -n {}: {}", shown(&script), String::from_utf8_lossy(&out.stderr));
    let mut count = BTreeMap::new();
    for (line, args) in run_local_command_lines() {
        let cli = parse_cli(&args).unwrap_or_else(|e| panic!("run-local.sh line {line}: {e:?}"));
        *count.entry(cli.subcommand).or_insert(0) += 1;
    }
    assert_eq!(count, BTreeMap::from([("frontend".to_string(), 2), ("ingest".to_string(), 3)]), "meshpilot processes");
}

#[test]
fn ownership_does_not_depend_on_dns_answer_order_within_the_autoscaler_range() {
    // Envoy lists strict-DNS hosts as DNS answers, meshpilot lists members by id. Maglev sorts
    // hosts by hash key before filling its table, so any order gives the same table.
    let base = load_base();
    let max: Vec<usize> = base
        .manifests
        .iter()
        .filter_map(|m| if let Object::Hpa(hpa) = &m.object { hpa.spec.as_ref() } else { None })
        .map(|spec| usize::try_from(spec.max_replicas).expect("maxReplicas"))
        .collect();
    assert!(!max.is_empty(), "no HorizontalPodAutoscaler for the frontends");
    for hosts in 1..=max.into_iter().max().unwrap_or(0) {
        // Sorted ids, as membership lists them ("10.0.0.10:15010" sorts before "10.0.0.2:15010").
        let mut ids: Vec<String> = (0..hosts).map(|i| format!("10.0.{}.{}:15010", i / 200, 2 + i % 200)).collect();
        ids.sort();
        let by_id = Ownership::new(ids.clone(), ProxyHashing::default()).expect("ownership");
        let reversed: Vec<String> = ids.iter().rev().cloned().collect();
        let mut rotated = ids.clone();
        rotated.rotate_left(hosts / 2);
        for order in [reversed, rotated] {
            let by_dns = Ownership::new(order.clone(), ProxyHashing::default()).expect("ownership");
            assert_eq!(by_dns, by_id, "{hosts} hosts: the table differs for ids in DNS order {order:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// End to end: the shipped Kubernetes LB config against a stub DNS name with three frontends

#[tokio::test]
async fn kubernetes_load_balancer_routes_each_key_to_the_frontend_owning_it() {
    const NAME: &str = "meshpilot-frontend.meshpilot-test.internal";
    // Three "frontends" on distinct loopback addresses, one port, as pods behind a headless
    // Service; each answers with its address, which is also its member id.
    let ips: Vec<Ipv4Addr> = (2..=4).map(|i| Ipv4Addr::new(127, 0, 0, i)).collect();
    let port = port_free_on(&ips);
    let ids: Vec<String> = ips.iter().map(|ip| format!("{ip}:{port}")).collect();
    let _frontends: Vec<Backend> =
        ips.iter().zip(&ids).map(|(ip, id)| Backend::builder(id).ip(*ip).port(port).start()).collect();
    // DNS answers in an order other than meshpilot's (sorted ids).
    let dns = StubDns::start(NAME, ips.iter().rev().copied().collect());

    // The shipped listener and cluster, changed only where the test environment needs it.
    let base = load_base();
    let lb = yaml_value(&generated_file(&base, "meshpilot-xds-lb-bootstrap", "xds-lb.yaml"));
    let mut cluster = named(&lb["static_resources"]["clusters"], "frontends", "LB bootstrap").clone();
    let mut listener = named(&lb["static_resources"]["listeners"], "xds", "LB bootstrap").clone();
    let listen_port = free_port();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
        json!({"address": NAME, "port_value": port});
    cluster["cluster_type"]["typed_config"]["typed_dns_resolver_config"] = json!({
        "name": "envoy.network.dns_resolver.cares",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.network.dns_resolver.cares.v3.CaresDnsResolverConfig",
            "resolvers": [{"socket_address": {"address": "127.0.0.1", "port_value": dns.port}}],
            "dns_resolver_options": {"no_default_search_domain": true}
        }
    });
    // The test backends speak HTTP/1.1, the test client too.
    cluster.as_object_mut().expect("cluster").remove("typed_extension_protocol_options");
    listener["address"]["socket_address"] = json!({"address": "127.0.0.1", "port_value": listen_port});
    listener["filter_chains"][0]["filters"][0]["typed_config"]["codec_type"] = json!("AUTO");

    let envoy = Envoy::builder("meshpilot-xds-lb", free_addr())
        .bootstrap_patch(json!({"dynamic_resources": null}))
        .static_cluster(cluster)
        .static_listener(listener)
        .start();
    envoy.wait_ready(STARTUP_TIMEOUT).await;
    // What the frontends compute, and its table for Envoy's gauges of slots per host.
    let ownership = Ownership::new(ids.clone(), ProxyHashing::default()).expect("ownership");
    let maglev = Maglev::new(ids.clone(), MaglevSettings::default()).expect("maglev");
    assert_eq!(ownership, Ownership::from(maglev.clone()), "the frontends' default hashing is Maglev");
    let min = maglev.counts().iter().min().copied();
    let max = maglev.counts().iter().max().copied();
    let resolved = envoy
        .wait_for(STARTUP_TIMEOUT, async |e| {
            e.stat("cluster.frontends.membership_total").await == Some(3)
                && e.stat("cluster.frontends.maglev_lb.min_entries_per_host").await == min
                && e.stat("cluster.frontends.maglev_lb.max_entries_per_host").await == max
        })
        .await;
    assert!(
        resolved,
        "Envoy did not resolve {NAME} to 3 hosts with a Maglev table of {min:?}..{max:?} slots per host; log:\n{}",
        envoy.logs()
    );

    let client = http_client();
    let url = format!("http://127.0.0.1:{listen_port}/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources");
    let mut disagreements = Vec::new();
    let mut used = BTreeSet::new();
    for i in 0..300 {
        let key = format!("ns-{}/sa-{i}", i % 7);
        let resp = http_request(&client, "POST", &url, "", &[(PROXY_KEY_HEADER, &key)], Some(""))
            .await
            .unwrap_or_else(|e| panic!("request with key {key}: {e}"));
        let backend = resp.header("x-backend").unwrap_or_else(|| panic!("key {key}: no x-backend ({})", resp.status));
        used.insert(backend.to_string());
        if ownership.owner(&key) != Some(backend) {
            disagreements.push(format!("{key}: Envoy chose {backend}, the frontends {:?}", ownership.owner(&key)));
        }
    }
    assert!(disagreements.is_empty(), "{} of 300 keys disagree:\n{}", disagreements.len(), disagreements.join("\n"));
    assert_eq!(used.len(), 3, "keys should reach every frontend: {used:?}");
}
