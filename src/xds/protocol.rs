//! One ADS protocol (state of the world in `connection`, delta in `delta`): how it answers
//! requests and computes one type's response, as the stream loop in `stream` drives it.

use std::future::Future;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::Any;

use super::response::Framed;
use super::session::Session;
use super::status::Transport;
use super::stream_context::StreamEnd;
use super::TypeUrl;

/// One debug resource: its name and the message answering it.
pub type DebugResource = (String, Any);

/// One ADS protocol: how requests are answered and how one type's response is computed.
pub trait Protocol: Send {
    /// The request message.
    type Request: Send;
    /// The response, encoded.
    type Response: Framed + Send + 'static;
    /// How `/debug/syncz` names it.
    const TRANSPORT: Transport;

    /// The node a request carries (the first request of a stream must).
    fn node(request: &Self::Request) -> Option<&Node>;

    /// The type a request is about.
    fn type_url(request: &Self::Request) -> &str;

    /// The resource names a debug request names.
    fn debug_names(request: &Self::Request) -> &[String];

    /// The answer to a debug request: `resources` of `type_url`, with this server's identifier.
    fn debug_response(
        type_url: &str,
        nonce: &str,
        control_plane: &str,
        resources: Vec<DebugResource>,
    ) -> Self::Response;

    /// Handles one request: subscriptions, ACK or NACK, and any response it calls for.
    fn on_request(
        &mut self,
        session: &mut Session<Self::Response>,
        request: Self::Request,
    ) -> impl Future<Output = Result<(), StreamEnd>> + Send;

    /// Whether the proxy subscribed to `type_url`.
    fn watches(&self, type_url: TypeUrl) -> bool;

    /// A new snapshot is about to be pushed (a bisection of the old one is moot).
    fn on_new_snapshot(&mut self);

    /// Whether every subscription holds a whole generation, acknowledged or not, with nothing
    /// set aside or under test: then a snapshot that changes none of the view's resources has
    /// nothing to send (the protocol would find the same generation and send nothing).
    fn settled(&self) -> bool {
        false
    }

    /// Pushes what changed of `type_url` in the session's snapshot; returns whether it sent.
    fn push(
        &mut self,
        session: &mut Session<Self::Response>,
        type_url: TypeUrl,
    ) -> impl Future<Output = Result<bool, StreamEnd>> + Send;

    /// After every type was pushed: sends what had to wait for the rest (removals of clusters
    /// and endpoints nothing refers to any more); returns whether it sent.
    fn finish_push(
        &mut self,
        _session: &mut Session<Self::Response>,
    ) -> impl Future<Output = Result<bool, StreamEnd>> + Send {
        async { Ok(false) }
    }
}
