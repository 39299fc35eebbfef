//! meshpilot command lines in the deployment (container args, `deploy/local/run-local.sh`),
//! checked against the CLI's flags.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Container;

use super::{local_dir, read};

/// Flags of `meshpilot ingest` the deployment may use.
pub const INGEST_FLAGS: &[&str] = &[
    "--etcd-endpoints",
    "--config-dir",
    "--mesh-config",
    "--snapshot-addr",
    "--advertise-addr",
    "--admin-addr",
    "--id",
    "--lease-ttl",
];
/// Flags of `meshpilot frontend` the deployment may use.
pub const FRONTEND_FLAGS: &[&str] =
    &["--etcd-endpoints", "--xds-addr", "--advertise-addr", "--admin-addr", "--id", "--proxy-key"];
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
}

/// Parses `args` (subcommand first; `--flag value` or `--flag=value`) against the CLI contract.
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
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        if !arg.starts_with("--") {
            problems.push(format!("unexpected argument {arg:?}"));
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
    let required: &[&str] =
        if subcommand == "ingest" { &["--etcd-endpoints", "--config-dir"] } else { &["--etcd-endpoints"] };
    for flag in required {
        if !flags.contains_key(*flag) {
            problems.push(format!("`meshpilot {subcommand}` needs {flag}"));
        }
    }
    if problems.is_empty() {
        Ok(Cli { subcommand: subcommand.clone(), flags })
    } else {
        Err(problems)
    }
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
