//! Exponential backoff with jitter between retries of etcd work.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Delays between retries: doubling from `min` up to `max`, each with ±25% jitter so that
/// many nodes retrying after an etcd restart do not arrive in lockstep.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Backoff starting at `min`, capped at `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max: max.max(min), next: min }
    }

    /// The delay before the next retry (and doubles the one after).
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay.mul_f64(0.75 + 0.5 * unit_random())
    }

    /// Back to `min`, after a success.
    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// A number in [0, 1) from std's randomly keyed hasher: enough for jitter without a RNG crate.
fn unit_random() -> f64 {
    let bits = RandomState::new().build_hasher().finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let d: Vec<Duration> = (0..4).map(|_| b.next_delay()).collect();
        assert!(d[0] >= Duration::from_millis(75) && d[0] <= Duration::from_millis(125));
        assert!(d[3] >= Duration::from_millis(300) && d[3] <= Duration::from_millis(500));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(125));
    }
}
