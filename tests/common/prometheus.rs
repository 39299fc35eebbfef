//! Prometheus for tests: a parser of the text exposition format (meshpilot's `/metrics`) and a
//! real Prometheus server scraping meshpilot processes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::http::http_client_with_timeout;
use super::poll::STARTUP_TIMEOUT;
use super::ports::free_addr;
use super::process::{deref_to_process, temp_dir, Process, ProcessSpec};

/// The value of the unlabelled sample `name` in Prometheus text.
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// One sample of the Prometheus text format.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Series name (`..._bucket`, `..._sum`, `..._count` for histograms).
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// Parsed `/metrics`: samples and `# TYPE` lines.
#[derive(Debug, Clone, Default)]
pub struct Samples {
    /// All samples in order.
    pub samples: Vec<Sample>,
    /// Family name → type (`counter`, `gauge`, `histogram`).
    pub types: BTreeMap<String, String>,
}

impl Samples {
    /// Parses the text exposition format (as the `prometheus` crate writes it).
    pub fn parse(text: &str) -> Samples {
        let mut out = Samples::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    out.types.insert(name.to_string(), kind.trim().to_string());
                }
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad sample line {line:?}"));
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
            let (name, labels) = match series.split_once('{') {
                None => (series.to_string(), BTreeMap::new()),
                Some((name, rest)) => (name.to_string(), parse_labels(rest.trim_end_matches('}'))),
            };
            out.samples.push(Sample { name, labels, value });
        }
        out
    }

    /// Samples of series `name` whose labels include `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .collect()
    }

    /// The value of the one sample of `name` with `labels` (panics if absent).
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.find(name, labels).as_slice() {
            [one] => one.value,
            other => panic!("expected one sample of {name}{labels:?}, found {other:?}"),
        }
    }

    /// Sum of `name` over all label sets matching `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).iter().map(|s| s.value).sum()
    }
}

/// `a="x",b="y\"z"` → {a: x, b: y"z}.
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    labels
}

/// The Prometheus binary: `$MESHPILOT_PROMETHEUS`, else `/usr/bin/prometheus` (Debian's package,
/// installed by `scripts/setup.sh`), else `prometheus` on the PATH.
pub fn prometheus_path() -> PathBuf {
    if let Some(p) = std::env::var_os("MESHPILOT_PROMETHEUS").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let debian = PathBuf::from("/usr/bin/prometheus");
    if debian.is_file() {
        return debian;
    }
    PathBuf::from("prometheus")
}

/// A real Prometheus scraping the given admin addresses every second (killed on drop; derefs to
/// its [`Process`]).
pub struct Prometheus {
    process: Process,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    http: reqwest::Client,
}

impl Prometheus {
    /// Starts Prometheus with a temp config and storage, scraping `targets` (job `meshpilot`),
    /// and waits until it is ready.
    pub async fn start(targets: &[SocketAddr]) -> Prometheus {
        let dir = temp_dir("meshpilot-prometheus-");
        let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: meshpilot\n    scrape_interval: 1s\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        );
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus.yml");
        let addr = free_addr();
        let spec = ProcessSpec::new("prometheus", prometheus_path())
            .args([
                format!("--config.file={}", config_path.display()),
                format!("--storage.tsdb.path={}", dir.path().join("data").display()),
                format!("--web.listen-address={addr}"),
            ])
            .log_tail(60, 60);
        let p = Prometheus {
            process: Process::start(dir, spec),
            url: format!("http://{addr}"),
            http: http_client_with_timeout(Duration::from_secs(10)),
        };
        p.process.wait_http_ready(&p.http, &format!("{}/-/ready", p.url), STARTUP_TIMEOUT).await;
        p
    }

    /// An instant query through the HTTP API: the whole JSON answer.
    pub async fn query(&self, expr: &str) -> serde_json::Value {
        let resp = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", expr)])
            .send()
            .await
            .unwrap_or_else(|e| panic!("query {expr}: {e}"));
        let body = resp.text().await.unwrap_or_default();
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("query {expr}: {e}: {body}"))
    }
}

deref_to_process!(Prometheus);
