//! The file source against an adversarial config directory, through the real `meshpilot`
//! binary run standalone: symlink loops, special and unreadable files, duplicates, writes in
//! place, and the directory vanishing. Each test starts one process and kills it at the end.

use crate::common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const VS: &str = "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: r}\nspec: {hosts: [a], http: [{route: [{destination: {host: a}}]}]}\n";

/// A standalone meshpilot on free ports; killed when dropped.
struct Meshpilot {
    child: Child,
    admin: String,
    log: PathBuf,
    client: reqwest::Client,
}

impl Meshpilot {
    /// Starts it on `config_dir`, logging to `log`, and waits until it serves a first snapshot.
    async fn start(config_dir: &Path, log: PathBuf) -> Meshpilot {
        let admin = common::ports::free_addr();
        let xds = common::ports::free_addr();
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_meshpilot"))
            .arg("standalone")
            .arg("--config-dir")
            .arg(config_dir)
            .args(["--xds-addr", &xds.to_string(), "--admin-addr", &admin.to_string(), "--no-secure-xds"])
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .unwrap();
        let client = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(2)).build().unwrap();
        let mp = Meshpilot { child, admin: format!("http://{admin}"), log, client };
        mp.wait_for("a first snapshot", Duration::from_secs(10), |c| c["configs"].is_array()).await;
        mp
    }

    async fn get(&self, path: &str) -> Option<(u16, String)> {
        let response = self.client.get(format!("{}{path}", self.admin)).send().await.ok()?;
        let status = response.status().as_u16();
        Some((status, response.text().await.ok()?))
    }

    async fn configz(&self) -> Value {
        match self.get("/debug/configz").await {
            Some((200, body)) => serde_json::from_str(&body).unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    async fn metrics(&self) -> String {
        self.get("/metrics").await.map(|(_, body)| body).unwrap_or_default()
    }

    /// Polls `/debug/configz` until `ok` holds; fails with the last one and the log after `limit`.
    async fn wait_for(&self, what: &str, limit: Duration, ok: impl Fn(&Value) -> bool) -> Value {
        let started = Instant::now();
        loop {
            let configz = self.configz().await;
            if ok(&configz) {
                return configz;
            }
            if started.elapsed() > limit {
                panic!("no {what} within {limit:?}; configz: {configz}\nlog:\n{}", self.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Meshpilot {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The hosts of the VirtualService `name` being served, if it is.
fn hosts(configz: &Value, name: &str) -> Option<Value> {
    configz["configs"].as_array()?.iter().find(|c| c["name"] == name).map(|c| c["spec"]["hosts"].clone())
}

fn errors_for<'a>(configz: &'a Value, file: &Path) -> Vec<&'a Value> {
    let file = file.display().to_string();
    configz["errors"].as_array().map(|e| e.iter().filter(|e| e["file"] == file.as_str()).collect()).unwrap_or_default()
}

fn mkfifo(path: &Path) {
    assert!(Command::new("mkfifo").arg(path).status().unwrap().success());
}

/// Writes `text` to `path` atomically (temp file + rename), as the tests' own edits do.
fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loops_special_files_and_duplicates_are_reported_and_the_rest_served() {
    // Reproduces: two symlink loops hung start-up (the servers never listened); a FIFO blocked the
    // watcher; `/dev/zero` was read without limit; non-UTF-8 files were only in the log; a
    // duplicate blamed the wrong file with "document 0".
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cfg");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("vs.yaml"), VS).unwrap();
    let other = VS.replace("name: r", "name: o");
    std::fs::write(dir.join("zz.yaml"), format!("{other}---\n{}", VS.replace("hosts: [a]", "hosts: [z]"))).unwrap();
    symlink(".", dir.join("l1")).unwrap();
    symlink(".", dir.join("l2")).unwrap();
    mkfifo(&dir.join("pipe.yaml"));
    symlink("/dev/zero", dir.join("zero.yaml")).unwrap();
    std::fs::write(dir.join("latin1.yaml"), b"metadata: {name: caf\xe9}\n").unwrap();

    let mp = Meshpilot::start(&dir, tmp.path().join("meshpilot.log")).await;
    let configz = mp
        .wait_for("errors for every bad file", Duration::from_secs(10), |c| {
            ["pipe.yaml", "zero.yaml", "latin1.yaml"].iter().all(|f| !errors_for(c, &dir.join(f)).is_empty())
        })
        .await;
    assert_eq!(hosts(&configz, "r"), Some(serde_json::json!(["a"])), "vs.yaml sorts first and wins: {configz}");
    assert!(hosts(&configz, "o").is_some(), "{configz}");
    assert_eq!(configz["configs"].as_array().unwrap().len(), 2, "each object once: {configz}");
    assert!(errors_for(&configz, &dir.join("pipe.yaml"))[0]["reason"].as_str().unwrap().contains("FIFO"));
    assert!(errors_for(&configz, &dir.join("zero.yaml"))[0]["reason"].as_str().unwrap().contains("character device"));
    assert!(errors_for(&configz, &dir.join("latin1.yaml"))[0]["reason"].as_str().unwrap().contains("UTF-8"));
    // One duplicate (no false ones from the loops), on the losing file's real document, naming
    // the winner.
    let duplicates: Vec<&Value> = configz["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reason"].as_str().is_some_and(|r| r.contains("duplicate")))
        .collect();
    assert_eq!(duplicates.len(), 1, "{configz}");
    assert_eq!(duplicates[0]["file"], dir.join("zz.yaml").display().to_string());
    assert_eq!(duplicates[0]["document"], 2);
    let winner = format!("{} document 1", dir.join("vs.yaml").display());
    assert!(duplicates[0]["reason"].as_str().unwrap().contains(&winner), "{}", duplicates[0]);

    let metrics = mp.metrics().await;
    for line in [
        "meshpilot_config_source_errors{reason=\"not_regular_file\",source=\"config-dir\"} 2",
        "meshpilot_config_source_errors{reason=\"not_utf8\",source=\"config-dir\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
    // By design a bad file does not fail readiness: the rest of the mesh is served.
    assert_eq!(mp.get("/ready").await.map(|(status, _)| status), Some(200));

    // The watcher still works: a change applies.
    write_atomic(&dir.join("vs.yaml"), &VS.replace("hosts: [a]", "hosts: [b]"));
    mp.wait_for("the change", Duration::from_secs(5), |c| hosts(c, "r") == Some(serde_json::json!(["b"]))).await;

    // `validate` on the same directory ends, and reports the bad files as errors.
    let started = Instant::now();
    let mut validate = Command::new(env!("CARGO_BIN_EXE_meshpilot"))
        .arg("validate")
        .arg("-f")
        .arg(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(status) = validate.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = validate.kill();
            let _ = validate.wait();
            panic!("validate did not end within 10 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let output = validate.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(status.code(), Some(1), "{stderr}");
    for file in ["pipe.yaml", "zero.yaml", "latin1.yaml"] {
        assert!(stderr.contains(&dir.join(file).display().to_string()), "{file} not reported:\n{stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_vanishing_is_an_outage_and_changes_apply_promptly_when_it_is_back() {
    // Reproduces: `rm -rf` of the config directory withdrew every object, and once it was back
    // changes were only picked up by the slow (10 s) poll.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cfg");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("vs.yaml"), VS).unwrap();
    let mp = Meshpilot::start(&dir, tmp.path().join("meshpilot.log")).await;
    mp.wait_for("the VirtualService", Duration::from_secs(5), |c| hosts(c, "r").is_some()).await;

    std::fs::remove_dir_all(&dir).unwrap();
    let configz = mp.wait_for("the outage reported", Duration::from_secs(5), |c| !errors_for(c, &dir).is_empty()).await;
    assert!(errors_for(&configz, &dir)[0]["reason"].as_str().unwrap().contains("missing"), "{configz}");
    // Keeps being served after the scan that found the directory gone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hosts(&mp.configz().await, "r"), Some(serde_json::json!(["a"])));
    let metrics = mp.metrics().await;
    let missing = "meshpilot_config_source_errors{reason=\"missing\",source=\"config-dir\"} 1";
    assert!(metrics.contains(missing), "{missing} missing:\n{metrics}");

    std::fs::create_dir(&dir).unwrap();
    write_atomic(&dir.join("vs.yaml"), &VS.replace("hosts: [a]", "hosts: [b]"));
    mp.wait_for("the directory back", Duration::from_secs(5), |c| {
        hosts(c, "r") == Some(serde_json::json!(["b"])) && errors_for(c, &dir).is_empty()
    })
    .await;
    // Watched again: a change applies well before the 10 s poll.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    write_atomic(&dir.join("vs.yaml"), &VS.replace("hosts: [a]", "hosts: [c]"));
    mp.wait_for("the change after the outage", Duration::from_secs(5), |c| {
        hosts(c, "r") == Some(serde_json::json!(["c"]))
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_place_never_withdraw_the_object() {
    // Reproduces: `cat bad > file` dropped the object (the file was read while empty, then the bad
    // content had nothing to keep); a truncate-then-write withdrew the routes briefly.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("cfg");
    std::fs::create_dir(&dir).unwrap();
    let file = dir.join("vs.yaml");
    std::fs::write(&file, VS).unwrap();
    let mp = Meshpilot::start(&dir, tmp.path().join("meshpilot.log")).await;
    mp.wait_for("the VirtualService", Duration::from_secs(5), |c| hosts(c, "r").is_some()).await;

    // Truncate, pause like a slow writer, then write: an invalid edit, then a valid one.
    for (text, expected_hosts, errors) in
        [(VS.replace("hosts: [a]", "hosts: 7"), "a", 1), (VS.replace("hosts: [a]", "hosts: [d]"), "d", 0)]
    {
        let writer = {
            let file = file.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&file).unwrap();
                std::thread::sleep(Duration::from_millis(30));
                f.write_all(text.as_bytes()).unwrap();
            })
        };
        // The object is there in every snapshot until the edit is in.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            let configz = mp.configz().await;
            if !configz.is_null() {
                assert!(hosts(&configz, "r").is_some(), "withdrawn: {configz}\n{}", mp.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        writer.join().unwrap();
        let configz = mp
            .wait_for("the edit", Duration::from_secs(5), |c| {
                hosts(c, "r") == Some(serde_json::json!([expected_hosts])) && errors_for(c, &file).len() == errors
            })
            .await;
        if errors == 1 {
            assert_eq!(errors_for(&configz, &file)[0]["document"], 1, "{configz}");
        }
    }
}
