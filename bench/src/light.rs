//! The light client (`--client light`): gRPC calls written as raw HTTP/2 streams (h2, no
//! tonic, hyper or tower on the client side) with request frames pre-encoded once and
//! only the fields that change per call appended, and answers decoded just enough for the
//! outcome checks. A few µs of client CPU per call instead of the tonic client's 15–25,
//! so more of the machine is left to the servers and their own cost shows in the ratios.

use std::time::Duration;

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use http::{HeaderValue, Method, Request, Uri};
use prost::Message;
use tokio::net::TcpStream;

use crate::args::ensure_loopback;

/// `/package.Service/Method` of the calls the light client makes.
pub const ACQUIRE_PATH: &str = "/inventory.v1.Agent/Acquire";
pub const HEALTH_PATH: &str = "/grpc.health.v1.Health/Check";

/// One HTTP/2 connection; callers hold clones (each one stream at a time).
#[derive(Clone)]
pub struct Conn {
    send: SendRequest<Bytes>,
    /// `scheme://authority` of the server, for the request URIs.
    base: String,
}

/// A call that got no answer: the gRPC code's name (as tonic prints it) or what failed.
pub type CallError = String;

/// `count` HTTP/2 connections (plain TCP, loopback only) to `url` (`http://host:port`).
pub async fn connect(url: &str, count: usize) -> anyhow::Result<Vec<Conn>> {
    ensure_loopback("target", url).map_err(anyhow::Error::msg)?;
    let uri: Uri = url.parse().with_context(|| format!("target {url:?}"))?;
    anyhow::ensure!(uri.scheme_str() == Some("http"), "the light client speaks plain http:// only, not {url}");
    let authority = uri.authority().context("target without host:port")?.clone();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let tcp = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(authority.as_str()))
            .await
            .with_context(|| format!("connect to {url}: timed out"))?
            .with_context(|| format!("connect to {url}"))?;
        tcp.set_nodelay(true)?;
        let (send, connection) = h2::client::handshake(tcp).await.with_context(|| format!("HTTP/2 with {url}"))?;
        // Ends when the connection closes (the server stopped, or every clone was dropped).
        tokio::spawn(async move {
            let _ = connection.await;
        });
        out.push(Conn { send, base: format!("http://{authority}") });
    }
    Ok(out)
}

impl Conn {
    /// The URI of `path` on this connection's server (built once per caller).
    pub fn uri(&self, path: &str) -> anyhow::Result<Uri> {
        Ok(format!("{}{path}", self.base).parse()?)
    }

    /// One unary call: `frame` is a whole gRPC message frame; the answer's message bytes
    /// (without the frame header), or the status that is not OK.
    pub async fn unary(
        &mut self,
        uri: &Uri,
        frame: Bytes,
        authorization: Option<&HeaderValue>,
    ) -> Result<Bytes, CallError> {
        std::future::poll_fn(|cx| self.send.poll_ready(cx)).await.map_err(|e| format!("http2: {e}"))?;
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri.clone())
            .header("content-type", HeaderValue::from_static("application/grpc"))
            .header("te", HeaderValue::from_static("trailers"));
        if let Some(auth) = authorization {
            request = request.header("authorization", auth.clone());
        }
        let request = request.body(()).map_err(|e| format!("request: {e}"))?;
        let (answer, mut body) = self.send.send_request(request, false).map_err(|e| format!("http2: {e}"))?;
        body.send_data(frame, true).map_err(|e| format!("http2: {e}"))?;
        let answer = answer.await.map_err(|e| format!("http2: {e}"))?;
        // Trailers-only: an error status and no message.
        if let Some(code) = status_code(answer.headers()) {
            return Err(code);
        }
        let mut recv = answer.into_body();
        let mut message = BytesMut::new();
        while let Some(chunk) = recv.data().await {
            let chunk = chunk.map_err(|e| format!("http2: {e}"))?;
            let _ = recv.flow_control().release_capacity(chunk.len());
            message.extend_from_slice(&chunk);
        }
        let trailers = recv.trailers().await.map_err(|e| format!("http2: {e}"))?;
        match trailers.as_ref().and_then(status_code) {
            Some(code) => Err(code),
            None if trailers.is_none() => Err("no grpc-status".to_owned()),
            None => unframe(message.freeze()),
        }
    }
}

/// The status in `headers` unless it is OK (or absent), as tonic's `Code` debug name.
fn status_code(headers: &http::HeaderMap) -> Option<String> {
    let v = headers.get("grpc-status")?;
    match tonic::Code::from_bytes(v.as_bytes()) {
        tonic::Code::Ok => None,
        code => Some(format!("{code:?}")),
    }
}

/// The message of one uncompressed gRPC frame.
fn unframe(frame: Bytes) -> Result<Bytes, CallError> {
    if frame.len() < 5 || frame[0] != 0 {
        return Err("bad grpc frame".to_owned());
    }
    let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
    if frame.len() != 5 + len {
        return Err("bad grpc frame length".to_owned());
    }
    Ok(frame.slice(5..))
}

/// A gRPC frame of the empty `HealthCheckRequest` (the server's overall health).
pub fn health_frame() -> Bytes {
    Bytes::from_static(&[0, 0, 0, 0, 0])
}

/// Whether a Health/Check answer says SERVING.
pub fn serving(message: &[u8]) -> bool {
    tonic_health::pb::HealthCheckResponse::decode(message)
        .is_ok_and(|r| r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32)
}

/// An Acquire request with the fields fixed for a run (item, quantity) encoded once;
/// [`AcquireTemplate::frame`] appends the user and the key of one call.
#[derive(Clone)]
pub struct AcquireTemplate {
    fixed: Bytes,
}

impl AcquireTemplate {
    pub fn new(item_id: &str, quantity: u64) -> Self {
        let fixed = inventory_proto::v1::AcquireRequest { item_id: item_id.to_owned(), quantity, ..Default::default() };
        Self { fixed: fixed.encode_to_vec().into() }
    }

    /// One call's gRPC frame: the fixed fields, then `user_id` (2) and `idempotency_key` (4).
    /// Protobuf decoders accept fields in any order.
    pub fn frame(&self, user_id: &str, idempotency_key: &str) -> Bytes {
        let len = self.fixed.len() + field_len(user_id) + field_len(idempotency_key);
        let mut out = BytesMut::with_capacity(5 + len);
        out.put_u8(0);
        out.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        out.put_slice(&self.fixed);
        put_string(2, user_id, &mut out);
        put_string(4, idempotency_key, &mut out);
        out.freeze()
    }
}

fn put_string(tag: u32, s: &str, out: &mut BytesMut) {
    prost::encoding::encode_key(tag, prost::encoding::WireType::LengthDelimited, out);
    prost::encoding::encode_varint(s.len() as u64, out);
    out.put_slice(s.as_bytes());
}

fn field_len(s: &str) -> usize {
    1 + prost::encoding::encoded_len_varint(s.len() as u64) + s.len()
}

#[cfg(test)]
mod tests {
    use inventory_proto::v1 as pb;

    use super::*;

    #[test]
    fn an_acquire_frame_decodes_as_the_request() {
        let frame = AcquireTemplate::new("launch-bundle", 2).frame("u42", "run-1-7");
        let message = unframe(frame).unwrap();
        let r = pb::AcquireRequest::decode(message).unwrap();
        assert_eq!(
            r,
            pb::AcquireRequest {
                item_id: "launch-bundle".into(),
                user_id: "u42".into(),
                quantity: 2,
                idempotency_key: "run-1-7".into(),
                ..Default::default()
            }
        );
    }

    #[test]
    fn frames_are_checked() {
        assert!(unframe(Bytes::from_static(&[0, 0, 0, 0])).is_err());
        assert!(unframe(Bytes::from_static(&[1, 0, 0, 0, 0])).is_err());
        assert!(unframe(Bytes::from_static(&[0, 0, 0, 0, 2, 8])).is_err());
        assert_eq!(unframe(Bytes::from_static(&[0, 0, 0, 0, 1, 8])).unwrap(), Bytes::from_static(&[8]));
    }
}
