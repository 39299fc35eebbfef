//! A part of meshpilot run in-process in its own task (an election candidate, a membership
//! registration): stopped gracefully, or dropped the way a dying process drops it.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The shutdown signal handed to the task: completes when [`Stoppable::stop`] is called.
pub type Shutdown = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A spawned task with a graceful stop; dropping it aborts the task without a shutdown (as when
/// the process dies: leases lapse instead of being revoked).
pub struct Stoppable {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Stoppable {
    /// Spawns `run(shutdown)`.
    pub fn spawn<F>(run: impl FnOnce(Shutdown) -> F) -> Stoppable
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(run(Box::pin(async move {
            let _ = stopped.await;
        })));
        Stoppable { stop: Some(stop), task }
    }

    /// Graceful stop: signals the shutdown and waits until the task has ended.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Stoppable {
    fn drop(&mut self) {
        self.task.abort();
    }
}
