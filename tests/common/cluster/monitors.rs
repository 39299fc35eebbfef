//! What runs beside a scale-out [`Cluster`](super::Cluster) while a test disturbs it: traffic
//! through the Envoys that must never fail, and a monitor of the frontends' versions and terms.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use meshpilot::snapshot::Version;
use serde_json::Value;

use crate::common::http::http_client_with_timeout;
use crate::common::ingress::{backend_of, Ingress};
use crate::common::meshpilot::Meshpilot;
use crate::common::poll::poll;
use crate::common::prometheus::metric_value;

use super::TIMEOUT;

/// Requests sent in a loop (one at a time, every 10 ms) through a proxy listener, counting
/// answers from a backend and everything else.
pub struct Traffic {
    what: String,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Traffic {
    /// Starts the loop: GET `/` through `ingress`, named `what` in messages.
    pub fn start(what: &str, ingress: Ingress) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let task = {
            let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
            tokio::spawn(async move {
                let t0 = Instant::now();
                while !stop.load(Ordering::SeqCst) {
                    match ingress.try_get("/", &[]).await {
                        Ok(r) if backend_of(&r).is_some() => {
                            ok.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(r) => failures.lock().unwrap().push(format!(
                            "at {:?}: status {} body {:?}",
                            t0.elapsed(),
                            r.status,
                            r.body.chars().take(200).collect::<String>()
                        )),
                        Err(e) => failures.lock().unwrap().push(format!("at {:?}: {e:?}", t0.elapsed())),
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        };
        Traffic { what: what.to_string(), stop, ok, failures, task }
    }

    /// Requests answered by a backend so far.
    pub fn ok(&self) -> u64 {
        self.ok.load(Ordering::SeqCst)
    }

    /// Waits until `n` more requests succeeded (the loop is running and healthy).
    pub async fn wait_progress(&self, n: u64) {
        let target = self.ok() + n;
        assert!(
            poll(TIMEOUT, async || self.ok() >= target).await,
            "{}: no progress ({} ok, failures {:?})",
            self.what,
            self.ok(),
            self.failures.lock().unwrap()
        );
    }

    /// Stops the loop and asserts nothing failed and at least `min_ok` requests succeeded.
    pub async fn finish(self, min_ok: u64) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let _ = (&mut { self.task }).await;
        let failures = self.failures.lock().unwrap().clone();
        let ok = self.ok.load(Ordering::SeqCst);
        assert!(
            failures.is_empty(),
            "{}: {} of {} requests failed: {:#?}",
            self.what,
            failures.len(),
            ok + failures.len() as u64,
            &failures[..failures.len().min(20)]
        );
        assert!(ok >= min_ok, "{}: only {ok} requests succeeded", self.what);
        eprintln!("{}: {ok} requests, none failed", self.what);
        ok
    }
}

/// Polls each frontend's `/debug/node` (`held`) and `/metrics` (`meshpilot_snapshot_leader_term`)
/// every 100 ms, recording violations of monotonicity: a frontend must never go back to an older
/// snapshot or term.
pub struct TermMonitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<String>, usize)>,
}

impl TermMonitor {
    /// Starts polling `frontends`.
    pub fn start(frontends: &[Meshpilot]) -> TermMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let targets: Vec<(String, String)> = frontends.iter().map(|f| (f.id().to_string(), f.admin_url())).collect();
        let task = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let client = http_client_with_timeout(Duration::from_secs(2));
                let mut highest: BTreeMap<String, (Version, f64)> = BTreeMap::new();
                let mut violations = Vec::new();
                let mut samples = 0;
                while !stop.load(Ordering::SeqCst) {
                    for (id, url) in &targets {
                        let held = async {
                            let node: Value =
                                client.get(format!("{url}/debug/node")).send().await.ok()?.json().await.ok()?;
                            node["held"].as_str()?.parse::<Version>().ok()
                        }
                        .await;
                        let term = async {
                            let text = client.get(format!("{url}/metrics")).send().await.ok()?.text().await.ok()?;
                            metric_value(&text, "meshpilot_snapshot_leader_term")
                        }
                        .await;
                        let (Some(held), Some(term)) = (held, term) else { continue };
                        samples += 1;
                        let entry = highest.entry(id.clone()).or_insert((held, term));
                        if held < entry.0 {
                            violations.push(format!("{id}: held {held} after {}", entry.0));
                        }
                        if term < entry.1 {
                            violations.push(format!("{id}: followed term {term} after {}", entry.1));
                        }
                        *entry = (entry.0.max(held), entry.1.max(term));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                (violations, samples)
            })
        };
        TermMonitor { stop, task }
    }

    /// Stops polling; asserts enough samples were taken and no frontend went back.
    pub async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        let (violations, samples) = self.task.await.expect("monitor task");
        assert!(samples > 10, "the term monitor took only {samples} samples");
        assert!(violations.is_empty(), "frontends went back in version or term: {violations:#?}");
    }
}
