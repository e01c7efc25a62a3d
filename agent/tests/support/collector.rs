//! A fake OTLP collector: the collector's TraceService on 127.0.0.1:0, keeping every span
//! it receives with the resource it came with.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// A received span and its resource's attributes.
#[derive(Clone, Debug)]
pub struct Received {
    pub span: Span,
    pub resource: Vec<KeyValue>,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<String> {
        string_of(&self.span.attributes, key)
    }

    pub fn resource_attribute(&self, key: &str) -> Option<String> {
        string_of(&self.resource, key)
    }
}

fn string_of(kvs: &[KeyValue], key: &str) -> Option<String> {
    let v = kvs.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().expect("collector lock");
        for rs in request.into_inner().resource_spans {
            let resource = rs.resource.map(|r| r.attributes).unwrap_or_default();
            for ss in rs.scope_spans {
                got.extend(ss.spans.into_iter().map(|span| Received { span, resource: resource.clone() }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

pub struct Collector {
    pub url: String,
    spans: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Collector {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind collector");
        let addr: SocketAddr = listener.local_addr().expect("collector address");
        let sink = Sink::default();
        let spans = sink.0.clone();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(sink))
                .serve_with_incoming(incoming)
                .await
                .expect("collector serves");
        });
        Self { url: format!("http://{addr}"), spans, task }
    }

    pub fn spans(&self) -> Vec<Received> {
        self.spans.lock().expect("collector lock").clone()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}
