//! The `meshpilot` command.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use meshpilot::config::parse::Document;
use meshpilot::config::source::files::parse_tree;
use meshpilot::frontend::FrontendSettings;
use meshpilot::ingest::DebounceSettings;
use meshpilot::standalone::{self, StandaloneSettings};

/// meshpilot: an Istio-compatible, horizontally scalable xDS control plane.
#[derive(Parser)]
#[command(name = "meshpilot", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run ingest and an xDS frontend in one process, from a directory of Istio YAML.
    Standalone(StandaloneArgs),
    /// Validate Istio YAML/JSON files; exit code 1 if any document is invalid.
    Validate {
        /// File or directory to validate.
        #[arg(short = 'f', long = "filename")]
        path: PathBuf,
    },
    /// Open N simulated sidecar ADS streams, ACK what they receive, and report convergence.
    Load {
        /// ADS URL of a frontend or of the hashing load balancer.
        #[arg(long, default_value = "http://127.0.0.1:15010")]
        xds_url: String,
        /// Number of simulated proxies.
        #[arg(long, default_value_t = 100)]
        proxies: usize,
        /// Namespaces to spread them over (comma separated).
        #[arg(long, default_value = "default", value_delimiter = ',')]
        namespaces: Vec<String>,
        /// Wait until every proxy acked at least this snapshot version (TERM.SEQ).
        #[arg(long)]
        wait_version: Option<meshpilot::snapshot::Version>,
        /// Give up after this long.
        #[arg(long, default_value = "60s", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Print the version.
    Version,
}

#[derive(Parser)]
struct StandaloneArgs {
    /// Directory of Istio config (YAML or JSON, watched).
    #[arg(long)]
    config_dir: PathBuf,
    /// MeshConfig file (watched).
    #[arg(long)]
    mesh_config: Option<PathBuf>,
    /// ADS (gRPC) listen address.
    #[arg(long, default_value = "127.0.0.1:15010")]
    xds_addr: SocketAddr,
    /// Admin HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:15014")]
    admin_addr: SocketAddr,
    /// Quiet period before a push (Istio's PILOT_DEBOUNCE_AFTER).
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    debounce_after: Duration,
    /// Longest debounce delay (Istio's PILOT_DEBOUNCE_MAX).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    debounce_max: Duration,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    meshpilot::config::api::Duration::parse(text).map(|d| d.as_std())
}

fn main() -> ExitCode {
    meshpilot::telemetry::init_logging();
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("meshpilot {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Validate { path } => validate(&path),
        Command::Load { xds_url, proxies, namespaces, wait_version, timeout } => {
            let settings = meshpilot::sim::load::LoadSettings { xds_url, proxies, namespaces, wait_version, timeout };
            match load(settings) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::FAILURE,
                Err(e) => {
                    eprintln!("meshpilot load: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Standalone(args) => match run_standalone(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("meshpilot: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run_standalone(args: StandaloneArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let settings = StandaloneSettings {
            config_dir: args.config_dir,
            mesh_config: args.mesh_config,
            debounce: DebounceSettings { after: args.debounce_after, max: args.debounce_max },
            frontend: FrontendSettings {
                xds_addr: args.xds_addr,
                admin_addr: args.admin_addr,
                identity: "standalone".into(),
            },
        };
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            let _ = stop_tx.send(true);
        });
        standalone::run(settings, stop_rx).await.context("standalone meshpilot")
    })
}

/// Runs a load test; `Ok(false)` when not every proxy converged.
fn load(settings: meshpilot::sim::load::LoadSettings) -> anyhow::Result<bool> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let report = runtime.block_on(meshpilot::sim::load::run(&settings));
    println!("{}", serde_json::to_string(&report).context("encoding the report")?);
    Ok(report.converged == settings.proxies)
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(t) => t,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

fn validate(path: &std::path::Path) -> ExitCode {
    let files = match parse_tree(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("meshpilot validate: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let (mut valid, mut invalid, mut ignored) = (0, 0, 0);
    for (_, docs) in &files {
        for doc in docs {
            match doc {
                Document::Valid(obj) => {
                    valid += 1;
                    println!("ok: {}", obj.key);
                }
                Document::Ignored { document, kind, name, .. } => {
                    ignored += 1;
                    println!("ignored: document {document}: {kind} {name} (not a kind meshpilot serves)");
                }
                Document::Invalid(err) => {
                    invalid += 1;
                    eprintln!("error: {err}");
                }
            }
        }
    }
    println!("{valid} valid, {invalid} invalid, {ignored} ignored in {} file(s)", files.len());
    if invalid > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
