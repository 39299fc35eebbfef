//! Debouncing source events into push requests (Istio's PILOT_DEBOUNCE_AFTER / _MAX).

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
}

impl Default for DebounceSettings {
    fn default() -> Self {
        DebounceSettings { after: Duration::from_millis(100), max: Duration::from_secs(10) }
    }
}

/// Waits for the next batch of events: the first event, then all that follow until the stream
/// is quiet for `after` or `max` has passed since the first. `None` when every sender is gone.
pub async fn next_batch<T>(rx: &mut mpsc::Receiver<T>, settings: DebounceSettings) -> Option<Vec<T>> {
    let first = rx.recv().await?;
    let started = Instant::now();
    let mut batch = vec![first];
    loop {
        let deadline = (Instant::now() + settings.after).min(started + settings.max);
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(event)) => batch.push(event),
            // Senders gone: flush what we have; the next call returns None.
            Ok(None) => return Some(batch),
            Err(_elapsed) => return Some(batch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn merges_a_burst_and_respects_max() {
        let (tx, mut rx) = mpsc::channel(100);
        let settings = DebounceSettings { after: Duration::from_millis(100), max: Duration::from_millis(350) };
        let producer = tokio::spawn(async move {
            // An event every 50 ms for 1 s: never quiet, so `max` must cut batches.
            for i in 0..20 {
                tx.send(i).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let first = next_batch(&mut rx, settings).await.unwrap();
        assert!((6..=9).contains(&first.len()), "batch cut by max: {first:?}");
        let mut total = first.len();
        while let Some(b) = next_batch(&mut rx, settings).await {
            total += b.len();
        }
        producer.await.unwrap();
        assert_eq!(total, 20);
    }

    #[tokio::test(start_paused = true)]
    async fn quiet_period_ends_a_batch() {
        let (tx, mut rx) = mpsc::channel(10);
        tx.send(1).await.unwrap();
        tx.send(2).await.unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            tx.send(3).await.unwrap();
        });
        assert_eq!(next_batch(&mut rx, DebounceSettings::default()).await.unwrap(), vec![1, 2]);
        assert_eq!(next_batch(&mut rx, DebounceSettings::default()).await.unwrap(), vec![3]);
        sender.await.unwrap();
    }
}
