//! The agent's connection to the center: registration (epoch), Borrow/Return with
//! request ids retried on UNAVAILABLE, heartbeats, and the channel's event stream.

mod borrows;
mod describes;
mod gather;
mod many;
mod returns;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use inventory_core::channel::lease;
use inventory_core::{AgentId, Channel};
use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Endpoint;
use tonic::{Code, Status};

/// Retries of one Borrow/Return on a retryable error, all with the same request id.
const ATTEMPTS: u32 = 5;

pub struct CenterLink {
    client: CenterClient<tonic::transport::Channel>,
    pub channel: Channel,
    pub agent_id: AgentId,
    epoch: AtomicU64,
    lease_ttl_ms: AtomicU64,
    /// Monotonic origin for lease arithmetic (immune to wall-clock jumps).
    origin: Instant,
    /// Until when (ms since `origin`) this agent may sell; 0: no lease.
    lease_until_ms: AtomicI64,
    lease_margin_ms: u64,
    /// Calls to the center in a row that got no answer (0 after any answer).
    failures_in_a_row: AtomicU32,
    /// Calls (attempts) that got no answer, in all.
    unanswered: AtomicU64,
    url: String,
    /// Calls the center refused for this agent's credentials (a token missing, wrong, or
    /// bound to another channel): a configuration error, not an outage.
    credential_refusals: AtomicU64,
    /// Whether the last call was refused for its credentials (cleared by any success).
    credentials_refused: AtomicBool,
    /// `Bearer <token>` for the center; never logged.
    auth: std::sync::RwLock<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>>,
    /// Borrows waiting to go to the center together ([`CenterLink::borrow`]).
    borrows: many::Lane<borrows::Borrows>,
    /// Returns waiting to go to the center together ([`CenterLink::give_back`]).
    returns: many::Lane<returns::Returns>,
    /// Item loads waiting to go to the center together ([`CenterLink::describe_to_load`]).
    describes: describes::Describes,
    /// The last bound on the center's clock (`inventory_core::schedule::CenterClock`):
    /// offset and round trip; `clock_known` once an answer carried the center's time.
    clock_offset_ms: AtomicI64,
    clock_round_trip_ms: AtomicI64,
    clock_known: AtomicBool,
    /// Test hook (`--test-clock-skew-ms`): this agent's wall clock runs this far ahead.
    clock_skew_ms: AtomicI64,
}

const MANY_UNKNOWN: u8 = 0;
const MANY_SERVED: u8 = 1;
/// The center answered UNIMPLEMENTED (an older center): single calls only.
const MANY_REFUSED: u8 = 2;

/// W3C trace context for a Borrow/Return: when spans are exported, the current span's (so
/// the center's span joins its trace); otherwise the request id (32 hex digits) is the
/// trace id, so the agent's and the center's log lines of one call share it.
fn with_traceparent<T>(req: &mut tonic::Request<T>, request_id: &str) {
    if inventory_net::trace::inject_current(req.metadata_mut()) {
        return;
    }
    if request_id.len() == 32 && request_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        let value = format!("00-{request_id}-{}-01", &request_id[..16]);
        if let Ok(v) = value.parse() {
            req.metadata_mut().insert("traceparent", v);
        }
    }
}

/// The center refused the call for who is calling: a configuration error.
pub fn refused_credentials(code: Code) -> bool {
    matches!(code, Code::PermissionDenied | Code::Unauthenticated)
}

/// Whether an error code is the center's own answer (the call reached its logic), as
/// opposed to a transport failure, a timeout or a broken connection.
fn answered(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::ResourceExhausted
            | Code::OutOfRange
            | Code::Unimplemented
    )
}

/// RESOURCE_EXHAUSTED is the center's rate limit for this channel: nothing was applied,
/// and the same call later (after the backoff) is served.
fn retryable(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::ResourceExhausted)
}

impl CenterLink {
    /// Does not connect yet: the first call does, and reconnects after failures.
    pub fn new(
        url: &str,
        channel: Channel,
        agent_id: AgentId,
        call_timeout: Duration,
        lease_margin: Duration,
        tls: Option<tonic::transport::ClientTlsConfig>,
        token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())?
            .connect_timeout(Duration::from_secs(2))
            .timeout(call_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls)?;
        }
        let auth = std::sync::RwLock::new(Self::bearer(token)?);
        Ok(Self {
            client: CenterClient::new(endpoint.connect_lazy()),
            channel,
            agent_id,
            epoch: AtomicU64::new(0),
            lease_ttl_ms: AtomicU64::new(0),
            origin: Instant::now(),
            lease_until_ms: AtomicI64::new(0),
            lease_margin_ms: u64::try_from(lease_margin.as_millis()).unwrap_or(u64::MAX),
            failures_in_a_row: AtomicU32::new(0),
            unanswered: AtomicU64::new(0),
            url: url.to_owned(),
            credential_refusals: AtomicU64::new(0),
            credentials_refused: AtomicBool::new(false),
            auth,
            borrows: many::Lane::default(),
            returns: many::Lane::default(),
            describes: describes::Describes::default(),
            clock_offset_ms: AtomicI64::new(0),
            clock_round_trip_ms: AtomicI64::new(0),
            clock_known: AtomicBool::new(false),
            clock_skew_ms: AtomicI64::new(0),
        })
    }

    /// Test hook: make this agent's wall clock run `skew_ms` ahead (behind if negative).
    pub fn set_clock_skew_ms(&self, skew_ms: i64) {
        self.clock_skew_ms.store(skew_ms, Ordering::Relaxed);
    }

    /// The agent's wall clock, ms since 1970 (skewed by the test hook, if set).
    pub fn wall_ms(&self) -> i64 {
        crate::clock::now_ms().saturating_add(self.clock_skew_ms.load(Ordering::Relaxed))
    }

    /// An answer sent at `sent_ms` (the agent's wall clock) carried the center's time.
    fn observe_clock(&self, sent_ms: i64, center_ms: i64) {
        if center_ms <= 0 {
            return; // an older center: no time in its answers
        }
        let c = inventory_core::schedule::CenterClock::measure(sent_ms, self.wall_ms(), center_ms);
        self.clock_offset_ms.store(c.offset_ms, Ordering::Relaxed);
        self.clock_round_trip_ms.store(c.round_trip_ms, Ordering::Relaxed);
        self.clock_known.store(true, Ordering::Release);
    }

    /// The center's time now, within bounds: the earliest it may read (never ahead of
    /// the center's clock as long as neither clock jumped since the last answer) and the
    /// latest (one round trip of that answer later). Unknown before any answer carried the
    /// center's time.
    pub fn center_now(&self) -> inventory_core::schedule::CenterNow {
        self.center_clock().map_or(inventory_core::schedule::CenterNow::UNKNOWN, |c| c.bounds(self.wall_ms()))
    }

    /// The last measurement of the center's clock.
    pub fn center_clock(&self) -> Option<inventory_core::schedule::CenterClock> {
        self.clock_known.load(Ordering::Acquire).then(|| inventory_core::schedule::CenterClock {
            offset_ms: self.clock_offset_ms.load(Ordering::Relaxed),
            round_trip_ms: self.clock_round_trip_ms.load(Ordering::Relaxed),
        })
    }

    /// Monotonic milliseconds, for stamping the moment a lease request is sent.
    pub fn now_ms(&self) -> i64 {
        i64::try_from(self.origin.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// The lease runs from when the request was *sent* (the center starts counting later,
    /// when it receives it), minus a safety margin: the agent stops selling before the
    /// center can consider the lease gone.
    pub fn renew_lease(&self, sent_at_ms: i64) {
        let until = lease::lease_until(sent_at_ms, self.lease_ttl_ms(), self.lease_margin_ms);
        self.lease_until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// A follower replica sells under the lease its leader published: `left_ms` from now.
    pub fn follow_lease(&self, left_ms: u64, asked_at_ms: i64) {
        self.lease_until_ms.store(lease::followed_lease_until(asked_at_ms, left_ms), Ordering::Release);
    }

    /// How long this agent may still sell, in ms (0: not at all).
    pub fn lease_left_ms(&self) -> u64 {
        u64::try_from(self.lease_until_ms.load(Ordering::Acquire) - self.now_ms()).unwrap_or(0)
    }

    pub fn drop_lease(&self) {
        self.lease_until_ms.store(0, Ordering::Release);
    }

    fn bearer(token: Option<&str>) -> anyhow::Result<Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>> {
        token
            .map(|t| format!("Bearer {t}").parse().map_err(|_| anyhow::anyhow!("center token is not ascii")))
            .transpose()
    }

    /// The token presented from the next call on (token files re-read on SIGHUP).
    pub fn set_token(&self, token: Option<&str>) -> anyhow::Result<()> {
        let auth = Self::bearer(token)?;
        *self.auth.write().unwrap_or_else(|e| e.into_inner()) = auth;
        Ok(())
    }

    /// A request carrying the agent's token.
    fn req<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(auth) = &*self.auth.read().unwrap_or_else(|e| e.into_inner()) {
            r.metadata_mut().insert("authorization", auth.clone());
        }
        r
    }

    /// The center counts as unreachable only after several calls in a row got no answer:
    /// one slow call under load must not make every empty pool answer UNAVAILABLE.
    pub fn reachable(&self) -> bool {
        lease::reachable(self.failures_in_a_row.load(Ordering::Acquire))
    }

    fn note(&self, result: &Result<impl Sized, Status>) {
        self.note_credentials(result);
        // Logged once per change of state; the failed calls themselves are counted.
        match result {
            Err(s) if !answered(s.code()) => {
                self.unanswered.fetch_add(1, Ordering::Relaxed);
                let before = self.failures_in_a_row.fetch_add(1, Ordering::AcqRel);
                if lease::reachable(before) && !lease::reachable(before + 1) {
                    tracing::warn!(center = %self.url, code = ?s.code(), "center lost: calls get no answer; retrying with backoff");
                }
            }
            _ => {
                if !lease::reachable(self.failures_in_a_row.swap(0, Ordering::AcqRel)) {
                    tracing::warn!(center = %self.url, "center regained");
                }
            }
        }
    }

    fn note_credentials(&self, result: &Result<impl Sized, Status>) {
        match result {
            Err(s) if refused_credentials(s.code()) => {
                self.credential_refusals.fetch_add(1, Ordering::Relaxed);
                if !self.credentials_refused.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        center_says = s.message(),
                        "the center refuses this agent's credentials; fix its token (--center-token) or channel"
                    );
                }
            }
            Ok(_) => {
                if self.credentials_refused.swap(false, Ordering::AcqRel) {
                    tracing::info!("the center accepts this agent's credentials again");
                }
            }
            Err(_) => {}
        }
    }

    /// Calls (attempts) to the center that got no answer so far.
    pub fn unanswered(&self) -> u64 {
        self.unanswered.load(Ordering::Relaxed)
    }

    /// The center's URL (for logs).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether the center refused the last call for its credentials.
    pub fn credentials_refused(&self) -> bool {
        self.credentials_refused.load(Ordering::Acquire)
    }

    /// Calls refused for their credentials so far.
    pub fn credential_refusals(&self) -> u64 {
        self.credential_refusals.load(Ordering::Relaxed)
    }

    pub fn lease_valid(&self) -> bool {
        self.now_ms() < self.lease_until_ms.load(Ordering::Acquire)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn lease_ttl_ms(&self) -> u64 {
        self.lease_ttl_ms.load(Ordering::Acquire)
    }

    /// Registers a new epoch, above `fenced_at` (the highest pool fence a resync found at
    /// or above the last epoch; 0: none). The lease is not granted here: the caller grants
    /// it ([`CenterLink::renew_lease`] with the send time) once pools are back in line.
    pub async fn register(&self, fenced_at: u64) -> Result<pb::RegisterAgentResponse, Status> {
        self.drop_lease();
        let wall_sent = self.wall_ms();
        let r = self
            .client
            .clone()
            .register_agent(self.req(pb::RegisterAgentRequest {
                channel: self.channel.to_string(),
                agent_id: self.agent_id.to_string(),
                fenced_at,
            }))
            .await
            .map(|r| r.into_inner());
        self.note_credentials(&r);
        let r = r?;
        self.observe_clock(wall_sent, r.center_now_unix_ms);
        self.epoch.store(r.epoch, Ordering::Release);
        self.lease_ttl_ms.store(r.lease_ttl_ms, Ordering::Release);
        Ok(r)
    }

    pub async fn describe(&self, item_id: &str) -> Result<pb::DescribeItemResponse, Status> {
        let req = pb::DescribeItemRequest { item_id: item_id.to_owned(), channel: self.channel.to_string() };
        let wall_sent = self.wall_ms();
        let r = self.client.clone().describe_item(self.req(req)).await.map(|r| r.into_inner());
        self.note_credentials(&r);
        if let Ok(d) = &r {
            self.observe_clock(wall_sent, d.center_now_unix_ms);
        }
        r
    }

    /// A Borrow under `epoch`: the epoch the caller read before it looked at the pool, so
    /// the call and the pool writes that go with it belong to one incarnation.
    ///
    /// Reports and, on success, renews the lease (counted from the send time).
    /// `last_report`: the agent has stopped selling and this is its last word (drain).
    pub async fn heartbeat(
        &self,
        pools: Vec<pb::PoolReport>,
        last_report: bool,
    ) -> Result<pb::HeartbeatResponse, Status> {
        let req = pb::HeartbeatRequest { channel: self.channel.to_string(), epoch: self.epoch(), pools, last_report };
        let sent_at = self.now_ms();
        let wall_sent = self.wall_ms();
        let r = self.client.clone().heartbeat(self.req(req)).await.map(|r| r.into_inner());
        self.note(&r);
        if let Ok(answer) = &r {
            self.renew_lease(sent_at);
            self.observe_clock(wall_sent, answer.center_now_unix_ms);
        }
        r
    }

    pub async fn watch(&self) -> Result<tonic::Streaming<pb::ChannelEvent>, Status> {
        let req = pb::WatchChannelRequest { channel: self.channel.to_string(), epoch: self.epoch() };
        // No deadline on the stream itself: it lives as long as the agent.
        let mut request = self.req(req);
        request.set_timeout(Duration::from_secs(365 * 24 * 3600));
        Ok(self.client.clone().watch_channel(request).await?.into_inner())
    }

    /// Calls `f` until it succeeds, fails for good, or the attempts run out. The request
    /// id inside is the same on every attempt, so the center applies the call once.
    async fn retry<T, F, Fut>(&self, epoch: u64, f: F) -> Result<T, Status>
    where
        F: Fn(CenterClient<tonic::transport::Channel>, u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, Status>>,
    {
        let mut delay = Duration::from_millis(50);
        let mut attempt = 1;
        // Every attempt carries the caller's epoch: a call begun before a re-registration
        // must be refused as stale, never replayed under the new epoch (the resync that
        // came with the new epoch already counted its effect or its absence).
        loop {
            let result = f(self.client.clone(), epoch).await;
            self.note(&result);
            match result {
                Ok(v) => return Ok(v),
                Err(s) if retryable(s.code()) && attempt < ATTEMPTS => {
                    tracing::debug!(code = ?s.code(), attempt, "center call failed, retrying with the same request id");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                    attempt += 1;
                }
                Err(s) => return Err(s),
            }
        }
    }
}
