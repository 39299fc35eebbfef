//! An in-test OTLP/gRPC receiver for meshpilot's traces and metrics, and readers of what it got.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::ResourceMetrics;
use opentelemetry_proto::tonic::trace::v1::Span;

use super::ports::bind_local;

/// A received span with its resource attributes.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    /// Resource attributes (as strings).
    pub resource: BTreeMap<String, String>,
    /// The span.
    pub span: Span,
}

impl ReceivedSpan {
    /// Hex trace id.
    pub fn trace_id(&self) -> String {
        hex(&self.span.trace_id)
    }

    /// Hex span id.
    pub fn span_id(&self) -> String {
        hex(&self.span.span_id)
    }

    /// Hex parent span id (empty for a root).
    pub fn parent_id(&self) -> String {
        hex(&self.span.parent_span_id)
    }

    /// A span attribute as a string.
    pub fn attr(&self, key: &str) -> Option<String> {
        attributes(&self.span.attributes).remove(key)
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Attributes as strings.
pub fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                Some(any_value::Value::IntValue(i)) => i.to_string(),
                Some(any_value::Value::DoubleValue(d)) => d.to_string(),
                Some(any_value::Value::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// What an [`OtlpReceiver`] got.
#[derive(Debug, Clone, Default)]
pub struct Received {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    metrics: Arc<Mutex<Vec<ResourceMetrics>>>,
}

impl Received {
    /// Every span so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every metrics export so far.
    pub fn metrics(&self) -> Vec<ResourceMetrics> {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        for rs in request.into_inner().resource_spans {
            let resource = attributes(&rs.resource.map(|r| r.attributes).unwrap_or_default());
            for ss in rs.scope_spans {
                for span in ss.spans {
                    spans.push(ReceivedSpan { resource: resource.clone(), span });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        self.metrics.lock().unwrap_or_else(|e| e.into_inner()).extend(request.into_inner().resource_metrics);
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

/// An OTLP/gRPC trace and metrics receiver on 127.0.0.1 (stops on drop).
pub struct OtlpReceiver {
    /// `http://127.0.0.1:PORT`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    /// What arrived.
    pub received: Received,
    task: tokio::task::JoinHandle<()>,
}

impl OtlpReceiver {
    /// Listens on a free port.
    pub async fn start() -> OtlpReceiver {
        let listener = bind_local().await;
        let addr = listener.local_addr().expect("local addr");
        let received = Received::default();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(received.clone()))
            .add_service(MetricsServiceServer::new(received.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        let task = tokio::spawn(async move {
            let _ = server.await;
        });
        OtlpReceiver { endpoint: format!("http://{addr}"), received, task }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
