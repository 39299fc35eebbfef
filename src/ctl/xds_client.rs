//! One of Istio's debug requests to a frontend's xDS port (see `crate::xds::debug`): how the
//! operator tools reach the frontends of a split deployment through their membership.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use futures::StreamExt;

use super::CtlError;

/// How long one frontend may take to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The node the tools present: not a proxy, so never listed as one.
const NODE_ID: &str = "debug~0.0.0.0~meshpilot-ctl.default~default.svc.cluster.local";

/// The answer of the frontend at `addr` (`host:port`, plaintext xDS) to a request for
/// `type_url` naming `names`.
pub async fn debug_request(addr: &str, type_url: &str, names: &[String]) -> Result<DiscoveryResponse, CtlError> {
    let fail = |why: String| CtlError::Xds { addr: addr.to_string(), why };
    let ask = async {
        let mut client = AggregatedDiscoveryServiceClient::connect(format!("http://{addr}"))
            .await
            .map_err(|e| fail(e.to_string()))?;
        let request = DiscoveryRequest {
            node: Some(Node { id: NODE_ID.to_string(), ..Default::default() }),
            type_url: type_url.to_string(),
            resource_names: names.to_vec(),
            ..Default::default()
        };
        let mut answers = client
            .stream_aggregated_resources(futures::stream::iter([request]).chain(futures::stream::pending()))
            .await
            .map_err(|e| fail(e.message().to_string()))?
            .into_inner();
        match answers.next().await {
            Some(Ok(response)) => Ok(response),
            Some(Err(status)) => Err(fail(format!("{:?}: {}", status.code(), status.message()))),
            None => Err(fail("the stream ended without an answer".into())),
        }
    };
    tokio::time::timeout(TIMEOUT, ask).await.map_err(|_| fail(format!("no answer within {TIMEOUT:?}")))?
}
