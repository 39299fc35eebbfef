//! The replay server's admin HTTP: `GET /ready`, and `POST /phase/<name>`, which pushes every
//! connected stream its workload's captured responses of that phase.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;

use super::streams::Replay;

/// The admin routes.
pub fn router(replay: Arc<Replay>) -> Router {
    Router::new().route("/ready", get(|| async { "ready\n" })).route("/phase/{name}", post(phase)).with_state(replay)
}

async fn phase(State(replay): State<Arc<Replay>>, Path(name): Path<String>) -> (StatusCode, String) {
    match replay.push_phase(&name).await {
        Some(pushed) => (StatusCode::OK, format!("{pushed}\n")),
        None => (StatusCode::NOT_FOUND, format!("no phase {name:?} in the capture\n")),
    }
}
