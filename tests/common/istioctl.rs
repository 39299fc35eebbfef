//! Istio's real `istioctl`, the operator's client, pointed at meshpilot's xDS port.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;

/// istioctl: `$MESHPILOT_ISTIOCTL`, else what `scripts/istio-tool.sh istioctl` built. `None` (the
/// test skips, saying why) where neither exists, except in CI, where that is a failure.
pub fn istioctl() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MESHPILOT_ISTIOCTL").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "MESHPILOT_ISTIOCTL={} does not exist", p.display());
        return Some(p);
    }
    let script = super::deploy::repo().join("scripts/istio-tool.sh");
    let out = Command::new("bash").arg(script).arg("istioctl").output().ok();
    if let Some(path) =
        out.filter(|o| o.status.success()).map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    {
        return Some(path);
    }
    let why = "istioctl is not available: `bash scripts/istio-tool.sh istioctl` builds it where Go exists \
               (or set MESHPILOT_ISTIOCTL)";
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why} (CI=true: this test must run)");
    eprintln!("SKIPPED: {why}");
    None
}

/// Runs `istioctl ARGS --xds-address XDS --plaintext --revision default` with a kubeconfig that
/// points nowhere: the commands read only xDS (without `--revision`, istioctl first waits for the
/// API server to tell it the default revision); returns its exit status success, stdout and stderr.
pub fn istioctl_xds(binary: &PathBuf, xds: SocketAddr, args: &[&str]) -> (bool, String, String) {
    let home = tempfile::tempdir().expect("temp dir");
    let kubeconfig = home.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: none, cluster: {server: 'https://127.0.0.1:1'}}]\n\
         contexts: [{name: none, context: {cluster: none, user: none}}]\ncurrent-context: none\n\
         users: [{name: none, user: {}}]\n",
    )
    .expect("write kubeconfig");
    let out = Command::new(binary)
        .args(args)
        .args(["--xds-address", &xds.to_string(), "--plaintext", "--revision", "default", "--kubeconfig"])
        .arg(&kubeconfig)
        .env("HOME", home.path())
        .output()
        .expect("run istioctl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
