//! What a frontend admits at once: new streams at a bounded rate, pushes up to a concurrency
//! limit, and each stream up to a maximum age. A reconnect storm (a frontend gone, its proxies
//! arriving here together) then queues behind the rate instead of starving pushes to the
//! proxies already connected, and streams that end at their age reconnect through the load
//! balancer, so proxies spread over frontends added since they connected. These are Istio's
//! `PILOT_MAX_REQUESTS_PER_SECOND`, `PILOT_PUSH_THROTTLE` and `keepaliveMaxServerConnectionAge`.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// Default new streams admitted per second (and the burst admitted at once). Istio allows 25/s
/// on 2 cores; here a stream's first push comes from the generation cache, and the benchmark's
/// physical limit (a server writing captured responses) brings in about 1,300 sidecars per second
/// on 2 cores: a rate below that would make admission, not the work, the bottleneck (1,000/s
/// measured 10.9 s for 10,000 sidecars against the limit's 7.8 s). Storms beyond it queue.
pub const DEFAULT_NEW_STREAMS_PER_SECOND: f64 = 2_000.0;
/// Default pushes of a new snapshot running at once (Istio: 100 at most).
pub const DEFAULT_PUSH_CONCURRENCY: usize = 100;
/// Default maximum stream age (Istio's chart sets `keepaliveMaxServerConnectionAge` to 30m).
pub const DEFAULT_MAX_STREAM_AGE: Duration = Duration::from_secs(30 * 60);
/// Up to this fraction of the age is added at random, so streams opened together do not all
/// reconnect together.
const AGE_JITTER: f64 = 0.1;

/// Admission limits of a frontend.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmissionSettings {
    /// New streams admitted per second; also the burst admitted at once.
    pub new_streams_per_second: f64,
    /// Snapshot pushes running at once.
    pub push_concurrency: usize,
    /// Streams end after this long (plus jitter); `None`: never.
    pub max_stream_age: Option<Duration>,
    /// Bytes generated config may take, cached or held by connections: beyond them, a proxy
    /// whose configuration no connected proxy shares is refused.
    pub config_memory_bytes: usize,
}

impl Default for AdmissionSettings {
    fn default() -> Self {
        AdmissionSettings {
            new_streams_per_second: DEFAULT_NEW_STREAMS_PER_SECOND,
            push_concurrency: DEFAULT_PUSH_CONCURRENCY,
            max_stream_age: Some(DEFAULT_MAX_STREAM_AGE),
            config_memory_bytes: super::cache::DEFAULT_BUDGET_BYTES,
        }
    }
}

/// The shared admission state of one frontend's ADS server.
#[derive(Debug)]
pub struct Admission {
    settings: AdmissionSettings,
    bucket: Mutex<Bucket>,
    pushes: Semaphore,
}

/// A token bucket: `tokens` as of `at`.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Default for Admission {
    fn default() -> Self {
        Admission::new(AdmissionSettings::default())
    }
}

impl Admission {
    /// Admission with these limits (a rate or concurrency of 0 is taken as 1).
    pub fn new(settings: AdmissionSettings) -> Admission {
        let rate = settings.new_streams_per_second.max(1.0);
        let settings = AdmissionSettings {
            new_streams_per_second: rate,
            push_concurrency: settings.push_concurrency.max(1),
            ..settings
        };
        Admission {
            bucket: Mutex::new(Bucket { tokens: rate, at: Instant::now() }),
            pushes: Semaphore::new(settings.push_concurrency),
            settings,
        }
    }

    /// The limits in force.
    pub fn settings(&self) -> AdmissionSettings {
        self.settings
    }

    /// Waits until a new stream may start. Each caller reserves its token at once (the bucket
    /// may go negative), so waiters are served in arrival order without holding a lock.
    pub async fn admit_stream(&self) {
        let wait = {
            let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
            let rate = self.settings.new_streams_per_second;
            let now = Instant::now();
            bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(rate);
            bucket.at = now;
            bucket.tokens -= 1.0;
            (bucket.tokens < 0.0).then(|| Duration::from_secs_f64(-bucket.tokens / rate))
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
    }

    /// Waits for a push slot; the push holds it until it has handed its responses on.
    pub async fn push_permit(&self) -> Option<SemaphorePermit<'_>> {
        // The semaphore is never closed; `None` would only mean pushing unthrottled.
        self.pushes.acquire().await.ok()
    }

    /// When a stream opened now must end: the maximum age plus up to 10% jitter drawn from
    /// `seed` (any per-stream value, such as a hash of the node id and the time).
    pub fn stream_deadline(&self, seed: u64) -> Option<Instant> {
        let age = self.settings.max_stream_age?;
        let fraction = (seed % 10_000) as f64 / 10_000.0;
        Some(Instant::now() + age + age.mul_f64(AGE_JITTER * fraction))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_storm_is_admitted_at_the_rate_after_the_burst() {
        let admission = Admission::new(AdmissionSettings { new_streams_per_second: 100.0, ..Default::default() });
        let started = Instant::now();
        for _ in 0..100 {
            admission.admit_stream().await;
        }
        assert!(started.elapsed() < Duration::from_millis(1), "the burst is admitted at once");
        for _ in 0..50 {
            admission.admit_stream().await;
        }
        let took = started.elapsed().as_secs_f64();
        assert!((took - 0.5).abs() < 0.02, "50 more at 100/s take half a second, took {took}");
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_arrivals_queue_in_order() {
        let admission = std::sync::Arc::new(Admission::new(AdmissionSettings {
            new_streams_per_second: 10.0,
            ..Default::default()
        }));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..30 {
            let a = admission.clone();
            tasks.spawn(async move {
                a.admit_stream().await;
                started.elapsed()
            });
        }
        let mut admitted: Vec<Duration> = tasks.join_all().await;
        admitted.sort();
        // 10 at once, then one every 100 ms: the last at 2 s.
        assert!(admitted[9] < Duration::from_millis(1));
        let last = admitted[29].as_secs_f64();
        assert!((last - 2.0).abs() < 0.02, "last admitted at {last}");
    }

    #[tokio::test]
    async fn pushes_beyond_the_limit_wait_for_a_slot() {
        let admission = Admission::new(AdmissionSettings { push_concurrency: 2, ..Default::default() });
        let a = admission.push_permit().await;
        let b = admission.push_permit().await;
        assert!(a.is_some() && b.is_some());
        let third = tokio::time::timeout(Duration::from_millis(20), admission.push_permit()).await;
        assert!(third.is_err(), "a third push waits while two run");
        drop(a);
        let third = tokio::time::timeout(Duration::from_millis(20), admission.push_permit()).await;
        assert!(third.is_ok_and(|p| p.is_some()), "and runs when one finishes");
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_spread_over_a_tenth_of_the_age() {
        let admission =
            Admission::new(AdmissionSettings { max_stream_age: Some(Duration::from_secs(100)), ..Default::default() });
        let now = Instant::now();
        let early = admission.stream_deadline(0).map(|d| d - now);
        let late = admission.stream_deadline(9_999).map(|d| d - now);
        assert_eq!(early, Some(Duration::from_secs(100)));
        assert!(late.is_some_and(|d| d > Duration::from_secs(109) && d <= Duration::from_secs(110)));
        let never = Admission::new(AdmissionSettings { max_stream_age: None, ..Default::default() });
        assert_eq!(never.stream_deadline(5), None);
    }
}
