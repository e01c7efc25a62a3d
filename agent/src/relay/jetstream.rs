//! The NATS JetStream sink: subject `<prefix>.<channel>.<item>`, the event's id as
//! `Nats-Msg-Id` (the stream drops a re-publish within its duplicate window), the payload
//! the protobuf-encoded `ReservationEvent`. The stream is created if missing.
//!
//! No credentials or TLS to the broker yet: `--nats-url` is a plain `nats://` URL.

use std::future::IntoFuture;
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use async_trait::async_trait;
use inventory_proto::v1 as pb;
use prost::Message;
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::state::AckPrefix;
use super::{EventSink, Published, SinkError};

/// Where and how events are published.
#[derive(Debug, Clone)]
pub struct JetStreamSettings {
    pub url: String,
    /// The stream, created if missing with subjects `<subject_prefix>.>`.
    pub stream: String,
    pub subject_prefix: String,
    /// How long the stream remembers a message id to drop its re-publish.
    pub duplicate_window: Duration,
    /// How long a publish waits for the broker's acknowledgement.
    pub ack_timeout: Duration,
}

impl JetStreamSettings {
    pub fn new(url: &str, stream: &str, subject_prefix: &str) -> Self {
        Self {
            url: url.to_owned(),
            stream: stream.to_owned(),
            subject_prefix: subject_prefix.trim_end_matches('.').to_owned(),
            duplicate_window: Duration::from_secs(120),
            ack_timeout: Duration::from_secs(2),
        }
    }

    pub fn subject(&self, channel: &str, item_id: &str) -> String {
        format!("{}.{channel}.{item_id}", self.subject_prefix)
    }
}

pub struct JetStreamSink {
    settings: JetStreamSettings,
    js: jetstream::Context,
    /// Whether the stream is known to exist (checked again after a failure: a broker
    /// restarted without its store has lost it).
    stream_ready: Mutex<bool>,
}

impl JetStreamSink {
    /// Connects in the background: a broker that is down at start is retried by the
    /// client, and publishes fail (and back off) meanwhile.
    pub async fn connect(settings: JetStreamSettings) -> anyhow::Result<Self> {
        let client = async_nats::ConnectOptions::new()
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(2))
            .max_reconnects(None)
            .connect(settings.url.as_str())
            .await
            .map_err(|e| anyhow::anyhow!("--nats-url {}: {e}", inventory_net::without_credentials(&settings.url)))?;
        // Acknowledgements the relay stopped awaiting are held by the client's acker, with a
        // permit of its in-flight bound each: no longer than an awaited one.
        let js = jetstream::context::ContextBuilder::new()
            .timeout(settings.ack_timeout)
            .ack_timeout(settings.ack_timeout)
            .build(client);
        Ok(Self { settings, js, stream_ready: Mutex::new(false) })
    }

    async fn ensure_stream(&self) -> Result<(), SinkError> {
        let mut ready = self.stream_ready.lock().await;
        if *ready {
            return Ok(());
        }
        let config = stream::Config {
            name: self.settings.stream.clone(),
            subjects: vec![format!("{}.>", self.settings.subject_prefix)],
            duplicate_window: self.settings.duplicate_window,
            storage: stream::StorageType::File,
            ..Default::default()
        };
        self.js
            .get_or_create_stream(config)
            .await
            .map_err(|e| SinkError::Unavailable(format!("stream {}: {e}", self.settings.stream)))?;
        *ready = true;
        Ok(())
    }
}

#[async_trait]
impl EventSink for JetStreamSink {
    async fn publish(&self, events: &[pb::ReservationEvent]) -> Published {
        if let Err(e) = self.ensure_stream().await {
            return Published { acked: 0, error: Some(e) };
        }
        let wait = self.settings.ack_timeout;
        // Pipelined: every message goes out before the first acknowledgement is awaited.
        // One deadline covers the sends, another all the acknowledgements: a broker that
        // died with the batch in flight costs one timeout, not one per event.
        let sends_due = Instant::now() + wait;
        let mut pending = Vec::with_capacity(events.len());
        let mut error = None;
        for e in events {
            let subject = self.settings.subject(&e.channel, &e.item_id);
            let message = PublishMessage::build().payload(e.encode_to_vec().into()).message_id(e.event_id.as_str());
            match tokio::time::timeout_at(sends_due, self.js.send_publish(subject, message)).await {
                Ok(Ok(ack)) => pending.push(ack),
                Ok(Err(e)) => {
                    error = Some(SinkError::Unavailable(e.to_string()));
                    break;
                }
                Err(_) => {
                    error = Some(SinkError::Unavailable(format!("not sent within {} ms", wait.as_millis())));
                    break;
                }
            }
        }
        let acks_due = Instant::now() + wait;
        let mut acks = AckPrefix::default();
        let mut failed = None;
        // Acknowledgements not awaited are dropped: the client's acker lets them go.
        for ack in pending {
            let answer = match tokio::time::timeout_at(acks_due, ack.into_future()).await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(classify(&e)),
                Err(_) => Some(SinkError::Unavailable(format!("no acknowledgement within {} ms", wait.as_millis()))),
            };
            let more = acks.record(answer.is_none());
            failed = failed.or(answer);
            if !more {
                break;
            }
        }
        // The first failure in publish order: an acknowledgement's, else the send's.
        let error = failed.or(error);
        if error.is_some() {
            // Maybe the broker came back without the stream: look again next time.
            *self.stream_ready.lock().await = false;
        }
        Published { acked: acks.acked(), error }
    }
}

fn classify(e: &async_nats::jetstream::context::PublishError) -> SinkError {
    use async_nats::jetstream::context::PublishErrorKind as K;
    match e.kind() {
        K::TimedOut | K::BrokenPipe | K::StreamNotFound => SinkError::Unavailable(e.to_string()),
        _ => SinkError::Refused(e.to_string()),
    }
}
