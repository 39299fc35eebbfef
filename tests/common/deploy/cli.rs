//! meshpilot command lines in the deployment (container args, `deploy/local/run-local.sh`),
//! checked against the CLI's flags. The flags are listed here, as src/main.rs (clap) defines
//! them: a flag renamed there must be renamed here and in the deployment.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Container;

use super::{local_dir, read};

/// Flags of `meshpilot ingest` the deployment may use.
pub const INGEST_FLAGS: &[&str] = &[
    "--etcd-endpoints",
    "--etcd-cacert",
    "--etcd-cert",
    "--etcd-key",
    "--kubernetes",
    "--kubeconfig",
    "--domain",
    "--namespace",
    "--config-dir",
    "--mesh-config",
    "--snapshot-addr",
    "--advertise-addr",
    "--admin-addr",
    "--id",
    "--lease-ttl",
    "--cacerts-dir",
    "--ca-dir",
    "--insecure-snapshot-stream",
    "--snapshot-peer-service-accounts",
    "--webhook-addr",
    "--webhook-service",
    "--webhook-tls-san",
    "--webhook-config-name",
];
/// Flags of `meshpilot frontend` the deployment may use.
pub const FRONTEND_FLAGS: &[&str] = &[
    "--etcd-endpoints",
    "--etcd-cacert",
    "--etcd-cert",
    "--etcd-key",
    "--xds-addr",
    "--advertise-addr",
    "--admin-addr",
    "--id",
    "--proxy-key",
    "--secure-xds-addr",
    "--no-secure-xds",
    "--no-plaintext-xds",
    "--xds-tls-san",
    "--cacerts-dir",
    "--ca-dir",
    "--insecure-snapshot-stream",
    "--kubernetes",
    "--kubeconfig",
    "--namespace",
];
/// Flags that take no value (clap `SetTrue`: `--flag`, never `--flag=VALUE`).
pub const SWITCHES: &[&str] = &["--kubernetes", "--no-secure-xds", "--no-plaintext-xds", "--insecure-snapshot-stream"];
/// Where `meshpilot ingest` reads config from: at least one is required.
pub const INGEST_SOURCES: &[&str] = &["--kubernetes", "--kubeconfig", "--config-dir"];
/// Two ways to name the cluster: at most one of them.
pub const CLUSTER_FLAGS: &[&str] = &["--kubernetes", "--kubeconfig"];
/// Values of `meshpilot frontend --proxy-key`.
pub const PROXY_KEYS: &[&str] = &["namespace-service-account", "node-id"];
/// The image name meshpilot containers use in the manifests (kustomize `images` rewrites it).
pub const MESHPILOT_IMAGE: &str = "meshpilot";

/// A parsed `meshpilot ingest|frontend ...` command line.
#[derive(Debug)]
pub struct Cli {
    /// `ingest` or `frontend`.
    pub subcommand: String,
    /// Flag → value.
    pub flags: BTreeMap<String, String>,
    /// The switches given ([`SWITCHES`]).
    pub switches: BTreeSet<String>,
}

impl Cli {
    /// Whether `flag` is given, as a switch or with a value.
    pub fn has(&self, flag: &str) -> bool {
        self.switches.contains(flag) || self.flags.contains_key(flag)
    }
}

/// Parses `args` (subcommand first; `--flag value`, `--flag=value`, or a bare switch) against
/// the CLI contract: known flags only, once each; `meshpilot ingest` needs a config source and
/// names the cluster at most one way.
pub fn parse_cli(args: &[String]) -> Result<Cli, Vec<String>> {
    let Some((subcommand, rest)) = args.split_first() else {
        return Err(vec!["no arguments: the subcommand (ingest or frontend) is missing".into()]);
    };
    let allowed = match subcommand.as_str() {
        "ingest" => INGEST_FLAGS,
        "frontend" => FRONTEND_FLAGS,
        other => return Err(vec![format!("subcommand {other:?} is neither ingest nor frontend")]),
    };
    let mut problems = Vec::new();
    let mut flags = BTreeMap::new();
    let mut switches = BTreeSet::new();
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        if !arg.starts_with("--") {
            problems.push(format!("unexpected argument {arg:?}"));
            continue;
        }
        if SWITCHES.contains(&arg.as_str()) || SWITCHES.iter().any(|s| arg.starts_with(&format!("{s}="))) {
            let (flag, value) = arg.split_once('=').unwrap_or((arg, ""));
            if !allowed.contains(&flag) {
                problems.push(format!("`meshpilot {subcommand}` has no flag {flag}"));
            }
            if !value.is_empty() {
                problems.push(format!("{flag} takes no value (got {value:?})"));
            }
            if !switches.insert(flag.to_string()) {
                problems.push(format!("{flag} given twice"));
            }
            continue;
        }
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
            None => {
                let value = rest.get(i).filter(|v| !v.starts_with("--")).cloned();
                if value.is_some() {
                    i += 1;
                }
                (arg.clone(), value)
            }
        };
        if !allowed.contains(&flag.as_str()) {
            problems.push(format!("`meshpilot {subcommand}` has no flag {flag}"));
        }
        let Some(value) = value else {
            problems.push(format!("{flag} has no value"));
            continue;
        };
        if flag == "--proxy-key" && !PROXY_KEYS.contains(&value.as_str()) {
            problems.push(format!("--proxy-key {value:?} is not one of {PROXY_KEYS:?}"));
        }
        if flags.insert(flag.clone(), value).is_some() {
            problems.push(format!("{flag} given twice"));
        }
    }
    let cli = Cli { subcommand: subcommand.clone(), flags, switches };
    if !cli.has("--etcd-endpoints") {
        problems.push(format!("`meshpilot {subcommand}` needs --etcd-endpoints"));
    }
    problems.extend(etcd_access_problems(&cli));
    if subcommand == "ingest" {
        if !INGEST_SOURCES.iter().any(|f| cli.has(f)) {
            problems.push(format!("`meshpilot ingest` needs a config source: one of {INGEST_SOURCES:?}"));
        }
        if CLUSTER_FLAGS.iter().all(|f| cli.has(f)) {
            problems.push(format!("{CLUSTER_FLAGS:?} exclude each other"));
        }
    }
    if problems.is_empty() {
        Ok(cli)
    } else {
        Err(problems)
    }
}

/// etcd must be reached as meshpilot's default demands: every endpoint `https://`, with the
/// CA and the client certificate etcd's `--client-cert-auth` requires (`--insecure-etcd` is no
/// flag the deployment may use at all).
pub fn etcd_access_problems(cli: &Cli) -> Vec<String> {
    let mut problems = Vec::new();
    let endpoints = cli.flags.get("--etcd-endpoints").map(String::as_str).unwrap_or_default();
    for endpoint in endpoints.split(',').filter(|e| !e.starts_with("https://")) {
        problems.push(format!("etcd endpoint {endpoint:?} is not https://"));
    }
    for flag in ["--etcd-cacert", "--etcd-cert", "--etcd-key"] {
        if !cli.has(flag) {
            problems.push(format!("`meshpilot {}` needs {flag} (etcd requires client certificates)", cli.subcommand));
        }
    }
    problems
}

/// Whether `container` runs meshpilot (by its image).
pub fn is_meshpilot(container: &Container) -> bool {
    container.image.as_deref() == Some(MESHPILOT_IMAGE)
}

/// The meshpilot command lines of deploy/local/run-local.sh: `start NAME "$MESHPILOT" ARGS...`.
pub fn run_local_command_lines() -> Vec<(usize, Vec<String>)> {
    let script = read(&local_dir().join("run-local.sh"));
    script
        .lines()
        .enumerate()
        .filter_map(|(n, line)| {
            let (_, rest) = line.strip_prefix("start ")?.split_once("\"$MESHPILOT\" ")?;
            let args = rest.split_whitespace().map(|t| t.trim_matches('"').to_string()).collect();
            Some((n + 1, args))
        })
        .collect()
}

/// Port of a `HOST:PORT` flag value.
pub fn port_of(addr: &str) -> Option<u16> {
    addr.rsplit_once(':')?.1.parse().ok()
}
