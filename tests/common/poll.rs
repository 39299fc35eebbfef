//! The one poll helper: run a check until it passes or a timeout passes, and the default timeouts.

use std::time::{Duration, Instant};

/// Default timeout for process start-up and readiness.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(60);
/// Default timeout for configuration to converge (an xDS push reaching Envoy, ...).
pub const CONVERGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Interval between two checks of [`poll`].
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What a polled check answers: `true` or `Some(_)` ends the poll.
pub trait Outcome {
    /// Whether this answer ends the poll.
    fn is_done(&self) -> bool;
}

impl Outcome for bool {
    fn is_done(&self) -> bool {
        *self
    }
}

impl<T> Outcome for Option<T> {
    fn is_done(&self) -> bool {
        self.is_some()
    }
}

/// Runs `check` every [`POLL_INTERVAL`] until it answers `true` / `Some(_)` or `timeout` passes,
/// and returns its last answer (`false` / `None` on timeout). `check` runs at least once.
pub async fn poll<T: Outcome>(timeout: Duration, check: impl AsyncFnMut() -> T) -> T {
    poll_every(POLL_INTERVAL, timeout, check).await
}

/// [`poll`] with another interval, for checks that time what they wait for more finely.
pub async fn poll_every<T: Outcome>(interval: Duration, timeout: Duration, mut check: impl AsyncFnMut() -> T) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let answer = check().await;
        if answer.is_done() || Instant::now() >= deadline {
            return answer;
        }
        tokio::time::sleep(interval).await;
    }
}
