//! The config the deployment ships: the Istio and mesh config are the examples' and valid, and
//! every Envoy bootstrap under `deploy/` passes `envoy --mode validate`.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::deploy::bootstraps::envoy_bootstraps;
use common::deploy::kube::{MESH_CONFIG_MAP, MESH_KEY};
use common::deploy::*;
use common::envoy::envoy_path;
use meshpilot::config::parse::Document;

#[test]
fn shipped_istio_and_mesh_config_are_the_examples_and_valid() {
    // The build with every generator: the base's mesh config and the component's config dir.
    let build = build(&config_dir_overlay());
    let mut problems = Vec::new();
    let mut checked = Vec::new();
    for generator in &build.generators {
        for (key, _) in generator.entries() {
            let (original, is_istio) = match (generator.name.as_str(), key.as_str()) {
                ("meshpilot-istio-config", _) => (repo().join("examples/bookinfo").join(&key), true),
                (MESH_CONFIG_MAP, MESH_KEY) => (repo().join("examples/mesh.yaml"), false),
                _ => continue,
            };
            checked.push(generator.name.as_str());
            let copy = generator.file(&key).expect("an entry's file");
            let text = read(&copy);
            if text != read(&original) {
                problems.push(format!("{} differs from {} (copy it again)", shown(&copy), shown(&original)));
            }
            if is_istio {
                for doc in meshpilot::config::parse::parse_file(&shown(&copy), &text) {
                    if let Document::Invalid(e) = doc {
                        problems.push(format!("{}: invalid: {e}", shown(&copy)));
                    }
                }
            } else if let Err(e) = meshpilot::mesh::MeshConfig::parse(&shown(&copy), &text) {
                problems.push(format!("{}: invalid mesh config: {e}", shown(&copy)));
            }
        }
    }
    for name in ["meshpilot-istio-config", MESH_CONFIG_MAP] {
        if !checked.contains(&name) {
            problems.push(format!("{}: no ConfigMap {name} to check", build.name));
        }
    }
    assert_no_problems("shipped config", &problems);
}

#[test]
fn envoy_bootstraps_pass_envoy_validate() {
    let envoy = envoy_path();
    let bootstraps = envoy_bootstraps();
    assert!(bootstraps.len() >= 4, "expected the LB and proxy bootstraps, found {bootstraps:?}");
    let mut problems = Vec::new();
    for path in &bootstraps {
        yaml_value(path); // plain YAML, one mapping
        let out = Command::new(&envoy)
            .args(["--mode", "validate", "--log-level", "warn", "-c"])
            .arg(path)
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", envoy.display()));
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            problems.push(format!("{}: envoy --mode validate failed:\n{text}", shown(path)));
        } else if text.contains("Deprecated field") {
            problems.push(format!("{}: uses deprecated Envoy fields:\n{text}", shown(path)));
        }
    }
    assert_no_problems("Envoy bootstraps", &problems);
    warn_if_image_differs(&envoy);
}

/// The LB image should be the Envoy version the bootstraps were validated with.
fn warn_if_image_differs(envoy: &Path) {
    let Ok(out) = Command::new(envoy).arg("--version").output() else { return };
    let version = String::from_utf8_lossy(&out.stdout).split('/').nth(1).unwrap_or_default().to_string();
    let manifest = read(&base_dir().join("xds-lb.yaml"));
    if !version.is_empty() && !manifest.contains(&format!("envoyproxy/envoy:v{version}")) {
        eprintln!(
            "note: deploy/kustomize/base/xds-lb.yaml does not use envoyproxy/envoy:v{version}, the validating Envoy"
        );
    }
}
