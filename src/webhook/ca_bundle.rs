//! Keeps the `caBundle` of every webhook of one ValidatingWebhookConfiguration at the CA's root,
//! as istiod does for its own: the API server then trusts the webhook's certificate, and a
//! re-applied manifest (which carries no `caBundle`) gets it back at once. A missing
//! configuration is not an error: the webhook is optional, and it is checked again.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::ByteString;
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tracing::{debug, info, warn};

/// The configuration is read again this often besides the watch's events.
const RESYNC: Duration = Duration::from_secs(60);

/// What one look at the configuration found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It does not exist (yet).
    Missing,
    /// Every webhook already had the bundle.
    UpToDate,
    /// It was updated.
    Patched,
}

/// Keeps the configuration `name`'s `caBundle` equal to `root_pem` until `stop` resolves.
pub async fn run(client: kube::Client, name: String, root_pem: String, stop: impl std::future::Future<Output = ()>) {
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    // Watched by name: events only for this configuration (RBAC may name it alone).
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api.clone(), config).applied_objects().boxed();
    let mut resync = tokio::time::interval(RESYNC);
    let mut last = None;
    tokio::pin!(stop);
    info!(config = %name, "keeping the validating webhook's caBundle at the CA's root");
    loop {
        tokio::select! {
            _ = &mut stop => return,
            event = events.next() => match event {
                Some(Ok(_)) => {}
                Some(Err(e)) => {
                    debug!(config = %name, error = %e, "ValidatingWebhookConfiguration watch");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                // The watcher retries by itself; should it end, the resync still runs.
                None => events = futures::stream::pending().boxed(),
            },
            _ = resync.tick() => {}
        }
        match reconcile(&api, &name, &root_pem).await {
            Ok(Outcome::Missing) if last != Some(Outcome::Missing) => {
                info!(config = %name, "ValidatingWebhookConfiguration not found; its caBundle is set once it exists");
                last = Some(Outcome::Missing);
            }
            Ok(outcome) => last = Some(outcome),
            // A conflict means someone else wrote it: the watch brings that version next.
            Err(e) => warn!(config = %name, error = %e, "updating the ValidatingWebhookConfiguration's caBundle"),
        }
    }
}

/// Sets `root_pem` as the `caBundle` of every webhook of the configuration `name` that lacks it.
pub async fn reconcile(
    api: &Api<ValidatingWebhookConfiguration>,
    name: &str,
    root_pem: &str,
) -> Result<Outcome, kube::Error> {
    let Some(mut config) = api.get_opt(name).await? else { return Ok(Outcome::Missing) };
    let bundle = ByteString(root_pem.as_bytes().to_vec());
    let webhooks = config.webhooks.iter_mut().flatten();
    let mut changed = 0;
    for webhook in webhooks.filter(|w| w.client_config.ca_bundle.as_ref() != Some(&bundle)) {
        webhook.client_config.ca_bundle = Some(bundle.clone());
        changed += 1;
    }
    if changed == 0 {
        return Ok(Outcome::UpToDate);
    }
    // A replace carries the resourceVersion read: a concurrent edit makes it fail, not vanish.
    let updated = api.replace(name, &PostParams::default(), &config).await?;
    info!(
        config = %name, webhooks = changed, resource_version = ?updated.metadata.resource_version,
        "validating webhook caBundle set to the CA's root"
    );
    Ok(Outcome::Patched)
}
