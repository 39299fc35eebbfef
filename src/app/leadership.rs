//! Work that runs only while this node leads (root certificate publishing, the webhook's
//! `caBundle` patching).

use std::future::Future;

use crate::drain::DrainWatcher;

/// Runs `task` each time this node becomes leader, until leadership is lost or the drain starts
/// (the future `task` is given resolves then); returns when the drain starts.
pub(super) async fn while_leading<F, Fut>(
    mut is_leader: tokio::sync::watch::Receiver<bool>,
    drain: DrainWatcher,
    mut task: F,
) where
    F: FnMut(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        if *is_leader.borrow_and_update() {
            let mut lost = is_leader.clone();
            let d = drain.clone();
            let stop = async move {
                tokio::select! {
                    _ = lost.wait_for(|leading| !leading) => {}
                    _ = d.draining() => {}
                }
            };
            task(Box::pin(stop)).await;
        }
        tokio::select! {
            changed = is_leader.changed() => if changed.is_err() { return },
            _ = drain.draining() => return,
        }
    }
}
