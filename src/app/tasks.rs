//! A role's long-running tasks in one set, each with a name: one that ends before the drain
//! starts, or panics, is a failure of the role, which then ends with a non-zero exit (Kubernetes
//! restarts the pod, and a peer takes over its work). Restarting a task in place would hide the
//! bug that ended it and leave `/ready` green over a node missing a part; a frontend or ingest
//! node is cheap to restart whole, with its state in its peers and etcd.

use std::collections::{HashMap, HashSet};
use std::future::Future;

use tokio::task::{Id, JoinError, JoinSet};
use tracing::{debug, error};

use crate::drain::DrainWatcher;

/// A task of a role that ended when it should not have.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// It returned before the drain started.
    #[error("task {0:?} ended before the drain started")]
    Ended(&'static str),
    /// It panicked (a bug).
    #[error("task {name:?} panicked: {message}")]
    Panicked {
        /// The task's name.
        name: &'static str,
        /// What the panic said.
        message: String,
    },
}

/// The tasks of one role, supervised together.
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
    /// Tasks whose ending is not a failure.
    once: HashSet<Id>,
    drain: DrainWatcher,
}

impl Tasks {
    /// An empty set whose tasks are expected to run until `drain` starts.
    pub fn new(drain: &DrainWatcher) -> Tasks {
        Tasks { set: JoinSet::new(), names: HashMap::new(), once: HashSet::new(), drain: drain.clone() }
    }

    /// The drain the tasks end with.
    pub fn drain(&self) -> &DrainWatcher {
        &self.drain
    }

    /// Runs `task` as `name` until the drain starts, when it is dropped: it has nothing to finish.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let task = self.until_drain(task);
        self.add(name, false, task);
    }

    /// Runs `task` as `name`; it watches the drain itself and ends once it has finished its part
    /// (a leader resigning, a member revoking its lease).
    pub fn spawn_finishing(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.add(name, false, task);
    }

    /// Runs `task` as `name` where ending early is its normal course (a one-shot wait): only a
    /// panic fails the role.
    pub fn spawn_once(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let task = self.until_drain(task);
        self.add(name, true, task);
    }

    /// `task`, ended when the drain starts.
    fn until_drain(
        &self,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> impl Future<Output = ()> + Send + 'static {
        let drain = self.drain.clone();
        async move {
            tokio::select! {
                _ = task => {}
                _ = drain.draining() => {}
            }
        }
    }

    fn add(&mut self, name: &'static str, once: bool, task: impl Future<Output = ()> + Send + 'static) {
        let id = self.set.spawn(task).id();
        self.names.insert(id, name);
        if once {
            self.once.insert(id);
        }
    }

    /// Waits until every task has ended: `Ok` if none ended before the drain started; otherwise
    /// the first failure, logged with the task's name, and the other tasks are aborted.
    pub async fn supervise(mut self) -> Result<(), TaskError> {
        while let Some(ended) = self.set.join_next_with_id().await {
            let failure = match ended {
                Ok((id, ())) if self.drain.is_draining() || self.once.contains(&id) => {
                    debug!(task = self.name(id), "task ended");
                    None
                }
                Ok((id, ())) => Some(TaskError::Ended(self.name(id))),
                Err(e) if e.is_cancelled() => None,
                Err(e) => Some(self.panicked(e)),
            };
            if let Some(failure) = failure {
                error!(error = %failure, "a task of this role failed: the role ends");
                self.set.abort_all();
                while self.set.join_next().await.is_some() {}
                return Err(failure);
            }
        }
        Ok(())
    }

    fn name(&self, id: Id) -> &'static str {
        self.names.get(&id).copied().unwrap_or("unnamed")
    }

    fn panicked(&self, e: JoinError) -> TaskError {
        let name = self.name(e.id());
        let message = match e.try_into_panic() {
            Ok(payload) => payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a non-text panic".to_string()),
            Err(e) => e.to_string(),
        };
        TaskError::Panicked { name, message }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::drain;

    #[tokio::test]
    async fn a_task_ending_before_the_drain_fails_the_role_by_name() {
        let (_trigger, watcher) = drain::new();
        let mut tasks = Tasks::new(&watcher);
        tasks.spawn("forever", std::future::pending());
        tasks.spawn_once("one shot", async {});
        tasks.spawn("leader watch", async {});
        let failure = tasks.supervise().await.expect_err("a failure");
        assert!(matches!(failure, TaskError::Ended("leader watch")), "{failure}");
    }

    #[tokio::test]
    async fn a_panic_fails_the_role_with_the_task_and_its_message() {
        let (_trigger, watcher) = drain::new();
        let mut tasks = Tasks::new(&watcher);
        tasks.spawn("forever", std::future::pending());
        tasks.spawn_once("subscriber", async { panic!("bad snapshot") });
        let failure = tasks.supervise().await.expect_err("a failure");
        assert_eq!(failure.to_string(), "task \"subscriber\" panicked: bad snapshot");
    }

    #[tokio::test]
    async fn with_the_drain_tasks_end_and_finishing_ones_are_waited_for() {
        let (trigger, watcher) = drain::new();
        let mut tasks = Tasks::new(&watcher);
        tasks.spawn("metrics", std::future::pending());
        let (done_tx, mut done_rx) = tokio::sync::mpsc::channel(1);
        let w = watcher.clone();
        tasks.spawn_finishing("resign", async move {
            w.draining().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = done_tx.send(()).await;
        });
        drop(watcher);
        let supervised = tokio::spawn(tasks.supervise());
        tokio::time::timeout(Duration::from_secs(5), trigger.start_drain_and_wait())
            .await
            .expect("the drain completes");
        assert!(done_rx.try_recv().is_ok(), "the finishing task was not waited for");
        assert!(supervised.await.expect("joined").is_ok());
    }
}
