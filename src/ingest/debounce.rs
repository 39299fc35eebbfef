//! Debouncing source events into push requests (Istio's PILOT_DEBOUNCE_AFTER / _MAX), with an
//! optional leading edge: an isolated change is released at once.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

/// Debounce timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebounceSettings {
    /// Quiet period after the last event before a push (Istio default 100 ms).
    pub after: Duration,
    /// Longest delay after the first event of a batch (Istio default 10 s).
    pub max: Duration,
    /// Release an event that follows a quiet period of at least `after` at once (Istio: no).
    pub leading_edge: bool,
}

impl Default for DebounceSettings {
    fn default() -> Self {
        DebounceSettings { after: Duration::from_millis(100), max: Duration::from_secs(10), leading_edge: true }
    }
}

/// Cuts a stream of events into batches; remembers when the last event came, for the leading edge.
#[derive(Debug)]
pub struct Debouncer {
    settings: DebounceSettings,
    /// When the last event was received (`None`: none yet, so the stream has been quiet).
    last_event: Option<Instant>,
}

impl Debouncer {
    /// A debouncer that has seen no event yet.
    pub fn new(settings: DebounceSettings) -> Self {
        Debouncer { settings, last_event: None }
    }

    /// Waits for the next batch; `None` when every sender is gone.
    ///
    /// Trailing edge (Istio): the first event, then all that follow until the stream is quiet
    /// for `after` or `max` has passed since the first. Leading edge: when the first event comes
    /// after at least `after` of quiet, the batch is that event and those already queued behind
    /// it, released at once; events that follow within `after` make the next, trailing, batch.
    /// `announces_more` marks events that a source sends just before the change they go with
    /// (a trace, a status): a leading-edge batch ending with one waits for what follows, so the
    /// change is not left to a trailing batch of its own.
    pub async fn next_batch<T>(
        &mut self,
        rx: &mut mpsc::Receiver<T>,
        announces_more: impl Fn(&T) -> bool,
    ) -> Option<Vec<T>> {
        let first = rx.recv().await?;
        let started = Instant::now();
        let quiet = self.last_event.is_none_or(|last| started.duration_since(last) >= self.settings.after);
        let leading = self.settings.leading_edge && quiet;
        let mut last = started;
        let mut batch = vec![first];
        loop {
            if leading {
                // Only what is queued now: a sender that never stops cannot keep this loop going.
                for _ in 0..rx.len() {
                    match rx.try_recv() {
                        Ok(event) => batch.push(event),
                        Err(_) => break,
                    }
                }
                if !batch.last().is_some_and(&announces_more) {
                    self.last_event = Some(last);
                    return Some(batch);
                }
            }
            let deadline = (last + self.settings.after).min(started + self.settings.max);
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(event)) => {
                    batch.push(event);
                    last = Instant::now();
                }
                // Senders gone (the next call returns None) or the batch is over.
                Ok(None) | Err(_) => {
                    self.last_event = Some(last);
                    return Some(batch);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_millis(100);

    fn settings(leading_edge: bool) -> DebounceSettings {
        DebounceSettings { after: AFTER, max: Duration::from_millis(375), leading_edge }
    }

    /// The batch and how long after the call it came.
    async fn timed(d: &mut Debouncer, rx: &mut mpsc::Receiver<i32>) -> (Vec<i32>, Duration) {
        let start = Instant::now();
        let batch = d.next_batch(rx, |e| *e < 0).await.unwrap();
        (batch, start.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn merges_a_burst_and_respects_max() {
        let (tx, mut rx) = mpsc::channel(100);
        let mut d = Debouncer::new(DebounceSettings {
            after: Duration::from_millis(100),
            max: Duration::from_millis(350),
            leading_edge: false,
        });
        let producer = tokio::spawn(async move {
            // An event every 50 ms for 1 s: never quiet, so `max` must cut batches.
            for i in 0..20 {
                tx.send(i).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let first = d.next_batch(&mut rx, |_| false).await.unwrap();
        assert!((6..=9).contains(&first.len()), "batch cut by max: {first:?}");
        let mut total = first.len();
        while let Some(b) = d.next_batch(&mut rx, |_| false).await {
            total += b.len();
        }
        producer.await.unwrap();
        assert_eq!(total, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_period_ends_a_batch() {
        let mut d = Debouncer::new(DebounceSettings { leading_edge: false, ..DebounceSettings::default() });
        let (tx, mut rx) = mpsc::channel(10);
        tx.send(1).await.unwrap();
        tx.send(2).await.unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.send(3).await.unwrap();
        });
        assert_eq!(d.next_batch(&mut rx, |_| false).await.unwrap(), vec![1, 2]);
        assert_eq!(d.next_batch(&mut rx, |_| false).await.unwrap(), vec![3]);
        sender.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn leading_edge_releases_isolated_events_and_coalesces_bursts() {
        let (tx, mut rx) = mpsc::channel(100);
        let mut d = Debouncer::new(settings(true));
        let t0 = Instant::now();
        let producer = tokio::spawn(async move {
            tx.send(1).await.unwrap();
            // A burst 10 ms later: 2, 3, 4 every 20 ms.
            for i in 2..=4 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tx.send(i).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Quiet for 500 ms, then another isolated event.
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.send(5).await.unwrap();
        });
        assert_eq!(timed(&mut d, &mut rx).await, (vec![1], Duration::ZERO), "isolated: at once");
        // The burst: the trailing edge, 100 ms after its last event (sent at 50 ms).
        assert_eq!(timed(&mut d, &mut rx).await, (vec![2, 3, 4], Duration::from_millis(150)));
        // Sent at 560 ms (after 500 ms of quiet): released the moment it was sent.
        assert_eq!(d.next_batch(&mut rx, |e| *e < 0).await.unwrap(), vec![5]);
        assert_eq!(t0.elapsed(), Duration::from_millis(560));
        producer.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn leading_edge_takes_what_is_queued_and_waits_for_an_announced_change() {
        let (tx, mut rx) = mpsc::channel(100);
        let mut d = Debouncer::new(settings(true));
        tx.send(1).await.unwrap();
        tx.send(2).await.unwrap();
        assert_eq!(timed(&mut d, &mut rx).await, (vec![1, 2], Duration::ZERO), "queued together");
        tokio::time::sleep(Duration::from_millis(200)).await;
        // -1 announces the change that follows (a trace): the batch waits for it, not for `after`.
        tx.send(-1).await.unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            tx.send(3).await.unwrap();
        });
        assert_eq!(timed(&mut d, &mut rx).await, (vec![-1, 3], Duration::from_millis(5)));
        sender.await.unwrap();
        assert_eq!(d.next_batch(&mut rx, |e| *e < 0).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn leading_edge_announcement_alone_ends_after_the_quiet_period() {
        let (tx, mut rx) = mpsc::channel(100);
        let mut d = Debouncer::new(settings(true));
        tx.send(-1).await.unwrap();
        assert_eq!(timed(&mut d, &mut rx).await, (vec![-1], AFTER));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn leading_edge_still_cut_by_max() {
        let (tx, mut rx) = mpsc::channel(100);
        let mut d = Debouncer::new(settings(true));
        let producer = tokio::spawn(async move {
            for i in 0..20 {
                tx.send(i).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        assert_eq!(timed(&mut d, &mut rx).await, (vec![0], Duration::ZERO));
        // Never quiet: the next batch starts at 50 ms and `max` (375 ms) cuts it at 425 ms.
        let (batch, waited) = timed(&mut d, &mut rx).await;
        assert_eq!(batch, (1..=8).collect::<Vec<_>>());
        assert_eq!(waited, Duration::from_millis(425));
        let (batch, waited) = timed(&mut d, &mut rx).await;
        assert!(!batch.is_empty() && waited > AFTER, "still trailing: {batch:?} after {waited:?}");
        let mut total = 9 + batch.len();
        while let Some(b) = d.next_batch(&mut rx, |e| *e < 0).await {
            total += b.len();
        }
        producer.await.unwrap();
        assert_eq!(total, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn trailing_only_waits_for_quiet_even_when_isolated() {
        let (tx, mut rx) = mpsc::channel(100);
        let mut d = Debouncer::new(settings(false));
        tx.send(1).await.unwrap();
        assert_eq!(timed(&mut d, &mut rx).await, (vec![1], AFTER));
        tokio::time::sleep(Duration::from_secs(1)).await;
        tx.send(2).await.unwrap();
        let later = tx.clone();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(60)).await;
            later.send(3).await.unwrap();
        });
        assert_eq!(timed(&mut d, &mut rx).await, (vec![2, 3], Duration::from_millis(160)));
        sender.await.unwrap();
        drop(tx);
        assert_eq!(d.next_batch(&mut rx, |e| *e < 0).await, None);
    }
}
