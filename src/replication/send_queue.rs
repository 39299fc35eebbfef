//! The bounded send queue of one snapshot subscriber: the server's feeder puts chunks in, the
//! subscription's response stream takes them out. Unlike a channel, the feeder can empty it: a
//! subscriber cut off for being too slow must not keep the chunks it never read (each one holds
//! the shared encoding of its update, maybe of a version long gone).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::sync::{Notify, Semaphore};
use tonic::Status;

use crate::replication::wire::proto::SnapshotChunk;

/// One item of a subscription's response stream.
pub(super) type Item = Result<SnapshotChunk, Status>;

/// Why an item was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SendError {
    /// The subscription's stream is gone.
    Gone,
    /// The queue stayed full for the whole stall deadline.
    Stalled,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    capacity: usize,
    /// Signalled when the reader took an item (there is room) or left.
    space: Notify,
    /// Closed when the reader left: its permits never come, so `acquire` fails at once.
    reader_gone: Semaphore,
    reader: AtomicWaker,
}

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Item>,
    /// The sender is done: the reader ends once it took what is queued.
    closed: bool,
    gone: bool,
}

/// The feeder's end.
#[derive(Debug)]
pub(super) struct QueueSender(Arc<Inner>);

/// The response stream's end.
#[derive(Debug)]
pub(super) struct QueueReceiver(Arc<Inner>);

/// A queue of at most `capacity` items.
pub(super) fn send_queue(capacity: usize) -> (QueueSender, QueueReceiver) {
    let inner = Arc::new(Inner {
        state: Mutex::default(),
        capacity: capacity.max(1),
        space: Notify::new(),
        reader_gone: Semaphore::new(0),
        reader: AtomicWaker::new(),
    });
    (QueueSender(inner.clone()), QueueReceiver(inner))
}

fn lock(inner: &Inner) -> MutexGuard<'_, State> {
    inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl QueueSender {
    /// Queues `item`, waiting for room at most `stall`.
    pub(super) async fn send(&self, item: Item, stall: Duration) -> Result<(), SendError> {
        let deadline = tokio::time::Instant::now() + stall;
        let mut item = Some(item);
        loop {
            {
                let mut state = lock(&self.0);
                if state.gone {
                    return Err(SendError::Gone);
                }
                if state.items.len() < self.0.capacity {
                    state.items.extend(item.take());
                    drop(state);
                    self.0.reader.wake();
                    return Ok(());
                }
            }
            // `notify_one` keeps a permit when nobody waits, so room made since the check counts.
            if tokio::time::timeout_at(deadline, self.0.space.notified()).await.is_err() {
                return Err(SendError::Stalled);
            }
        }
    }

    /// Drops everything queued and ends the stream with `status` (once the reader polls again).
    pub(super) fn cut_off(&self, status: Status) {
        let dropped = {
            let mut state = lock(&self.0);
            let dropped = std::mem::take(&mut state.items);
            state.items.push_back(Err(status));
            state.closed = true;
            dropped
        };
        drop(dropped);
        self.0.reader.wake();
    }

    /// Queues a last item even when full (an error ending the stream), and closes the queue.
    pub(super) fn finish(&self, status: Status) {
        let mut state = lock(&self.0);
        state.items.push_back(Err(status));
        state.closed = true;
        drop(state);
        self.0.reader.wake();
    }

    /// Resolves once the subscription's stream is gone.
    pub(super) async fn closed(&self) {
        let _ = self.0.reader_gone.acquire().await;
    }

    /// Items queued now.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        lock(&self.0).items.len()
    }
}

impl Drop for QueueSender {
    fn drop(&mut self) {
        lock(&self.0).closed = true;
        self.0.reader.wake();
    }
}

impl QueueReceiver {
    /// The next item; `None` once the sender is done and everything was taken.
    pub(super) fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.0.reader.register(cx.waker());
        let mut state = lock(&self.0);
        if let Some(item) = state.items.pop_front() {
            drop(state);
            self.0.space.notify_one();
            return Poll::Ready(Some(item));
        }
        if state.closed {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

impl Drop for QueueReceiver {
    fn drop(&mut self) {
        let dropped = {
            let mut state = lock(&self.0);
            state.gone = true;
            std::mem::take(&mut state.items)
        };
        drop(dropped);
        self.0.reader_gone.close();
        self.0.space.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::poll_fn;

    fn chunk(index: u32) -> Item {
        Ok(SnapshotChunk { index, ..Default::default() })
    }

    #[tokio::test]
    async fn a_full_queue_stalls_and_a_cut_off_empties_it() {
        let (tx, mut rx) = send_queue(2);
        tx.send(chunk(0), Duration::from_millis(10)).await.expect("room");
        tx.send(chunk(1), Duration::from_millis(10)).await.expect("room");
        assert_eq!(tx.send(chunk(2), Duration::from_millis(50)).await, Err(SendError::Stalled));
        // Room made while waiting is used.
        let sending = tokio::spawn(async move {
            let r = tx.send(chunk(2), Duration::from_secs(5)).await;
            (tx, r)
        });
        let first = poll_fn(|cx| rx.poll_recv(cx)).await.expect("item").expect("ok");
        assert_eq!(first.index, 0);
        let (tx, sent) = sending.await.expect("task");
        assert_eq!(sent, Ok(()));
        tx.cut_off(Status::resource_exhausted("too slow"));
        assert_eq!(tx.len(), 1);
        let last = poll_fn(|cx| rx.poll_recv(cx)).await.expect("item");
        assert_eq!(last.expect_err("the cut-off").code(), tonic::Code::ResourceExhausted);
        assert!(poll_fn(|cx| rx.poll_recv(cx)).await.is_none());
    }

    #[tokio::test]
    async fn the_sender_learns_when_the_reader_left() {
        let (tx, rx) = send_queue(1);
        tx.send(chunk(0), Duration::from_millis(10)).await.expect("room");
        drop(rx);
        tokio::time::timeout(Duration::from_secs(1), tx.closed()).await.expect("closed resolves");
        assert_eq!(tx.send(chunk(1), Duration::from_secs(5)).await, Err(SendError::Gone));
        assert_eq!(tx.len(), 0, "what was queued is released");
    }
}
