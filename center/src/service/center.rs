//! The Center service: what agents call (BorrowMany and ReturnMany in `many`).

mod many;
mod stream;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use futures::Stream;
use inventory_core::ids::MAX_QUANTITY;
use inventory_core::ledger::MAX_BORROW_LINES;
use inventory_core::ledger::PoolCounts;
use inventory_core::loss::PoolReport;
use inventory_core::{AgentId, Channel, ItemId, Quantity, RequestId, ValidationError};
use inventory_proto::v1 as pb;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{pb_limit_scope, pb_rate_batching, pb_registry_fallback, pb_schedule, pb_watermarks};
use crate::clock::now_ms;
use crate::error::CenterError;
use crate::events::{EventHub, LedgerEvent};
use crate::security::{authorize, own_channel};
use crate::store::{BorrowRate, LedgerStore, PoolReportIn};

/// Lease and reclaim timing.
#[derive(Debug, Clone, Copy)]
pub struct LeaseSettings {
    pub lease_ttl_ms: u64,
    pub reclaim_grace_ms: u64,
}

/// Fault injection for tests of the failure paths. All off unless a test arms them.
#[derive(Debug, Default)]
pub struct FaultHooks {
    /// The next N Borrow calls commit and then never answer (the reply is lost after
    /// commit); the caller's deadline ends the call.
    pub lose_borrow_replies: AtomicU32,
    /// BorrowMany answers UNIMPLEMENTED, as a center from before it did.
    pub refuse_borrow_many: AtomicBool,
    /// ReturnMany answers UNIMPLEMENTED, as a center from before it did.
    pub refuse_return_many: AtomicBool,
    /// DescribeItems answers UNIMPLEMENTED, as a center from before it did.
    pub refuse_describe_items: AtomicBool,
    /// While true, Borrow calls wait before they are applied, and are applied once it turns
    /// false even if their caller gave up meanwhile: as a transaction that waits for a
    /// database that comes back commits then, or a frozen process resumes its calls.
    pub hold_borrows: watch::Sender<bool>,
    /// Borrow calls that waited under `hold_borrows`.
    pub held_borrows: AtomicU32,
    /// While true, WatchChannel answers UNAVAILABLE, as a center the agent cannot reach
    /// for its stream: what is scheduled meanwhile is told when the stream opens.
    pub refuse_watches: AtomicBool,
    /// WatchChannel calls refused under `refuse_watches`.
    pub watches_refused: AtomicU32,
    /// While true, open WatchChannel streams take no event from the hub, as the stream of
    /// a watcher too slow to keep up: past [`crate::events::CAPACITY`] events it lagged.
    pub stall_watches: watch::Sender<bool>,
    /// DescribeItem and DescribeItems calls received.
    pub describes: AtomicU32,
    /// The next N Heartbeat calls are refused FAILED_PRECONDITION as of a stale epoch, as
    /// a center whose ledger went back below the channel's epoch refuses them.
    pub refuse_heartbeats: AtomicU32,
    /// Faults of the PostgreSQL event path (its notifications and its listener).
    pub events: Arc<crate::events::EventFaults>,
}

impl FaultHooks {
    fn take(counter: &AtomicU32) -> bool {
        counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
    }
}

pub struct CenterService {
    store: Arc<dyn LedgerStore>,
    events: EventHub,
    lease: LeaseSettings,
    faults: Arc<FaultHooks>,
    /// Stuck drift: an item whose pools hold more than the ledger counts is not lent.
    history: Arc<crate::history::History>,
    /// Turns true when the center shuts down: every `WatchChannel` stream then ends.
    stop: watch::Receiver<bool>,
    /// Requests made longer ago than this are refused, not applied again
    /// (`inventory_core::records`).
    request_max_age_ms: u64,
    /// Each channel's call rate and open streams.
    limits: Arc<crate::limits::ChannelLimits>,
}

impl CenterService {
    pub fn new(
        store: Arc<dyn LedgerStore>,
        events: EventHub,
        lease: LeaseSettings,
        faults: Arc<FaultHooks>,
        history: Arc<crate::history::History>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        let request_max_age_ms = inventory_core::records::DEFAULT_MAX_AGE_MS;
        let limits = Arc::new(crate::limits::ChannelLimits::new(
            crate::limits::DEFAULT_RATE_PER_SEC,
            crate::limits::DEFAULT_BURST,
            crate::limits::DEFAULT_MAX_WATCHES,
        ));
        Self { store, events, lease, faults, history, stop, request_max_age_ms, limits }
    }

    pub fn with_limits(mut self, limits: Arc<crate::limits::ChannelLimits>) -> Self {
        self.limits = limits;
        self
    }

    pub fn with_request_max_age_ms(mut self, ms: u64) -> Self {
        self.request_max_age_ms = ms;
        self
    }

    /// A request whose id says it was made longer ago than records are kept: its record
    /// may be gone, so it is refused rather than applied again.
    fn refuse_if_too_old(&self, request_id: &RequestId) -> Result<(), CenterError> {
        match inventory_core::records::too_old(request_id.as_str(), now_ms(), self.request_max_age_ms) {
            Some(why) => Err(CenterError::Precondition(why)),
            None => Ok(()),
        }
    }

    /// The pools hold more of `item` than the ledger counts with their channels: the ledger
    /// lost commits, and its `available` counts units already on shelves. Nothing of the
    /// item is lent until the lost grants are re-learned (the console's sampler does it),
    /// or, just after the center started, until a report shows the drift was in flight.
    fn refuse_if_beyond_ledger(&self, item: &ItemId) -> Result<(), Status> {
        let beyond = self.history.beyond_ledger(item.as_str());
        if beyond > 0 {
            return Err(Status::unavailable(format!(
                "item {item}: pools hold {beyond} units more than the ledger counts (lost commits?); not lending it \
                 until they are re-learned or explained; retry with the same request_id"
            )));
        }
        Ok(())
    }
}

type Res<T> = Result<Response<T>, Status>;

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::ChannelEvent, Status>> + Send>>;

impl CenterService {
    /// Fills a scheduled item's opening allocation for `channel` while the item has not
    /// opened; the live channels are read once per call (`live`).
    async fn opening_allocation(
        &self,
        d: &mut pb::DescribeItemResponse,
        channel: &Channel,
        live: &mut Option<Vec<String>>,
    ) -> Result<(), CenterError> {
        let now = now_ms();
        if d.opens_at_unix_ms <= now || d.closed {
            return Ok(());
        }
        if live.is_none() {
            let channels = self.store.channels().await?;
            *live = Some(channels.into_iter().filter(|c| c.session.lease_live(now)).map(|c| c.channel).collect());
        }
        let item = ItemId::parse("item_id", &d.item_id)?;
        let record = self.store.policy(&item, None).await?.item;
        let names: Vec<&str> = live.iter().flatten().map(String::as_str).collect();
        d.opening_allocation = record.opening_allocation(&names, channel.as_str());
        Ok(())
    }
}

#[tonic::async_trait]
impl pb::center_server::Center for CenterService {
    async fn register_agent(&self, request: Request<pb::RegisterAgentRequest>) -> Res<pb::RegisterAgentResponse> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        self.limits.call(channel.as_str(), 1)?;
        let agent = AgentId::parse("agent_id", &r.agent_id).map_err(CenterError::from)?;
        // Epochs are stored as signed 64-bit numbers, and the next one is above the fence.
        let max_fence = i64::MAX.unsigned_abs() - 1;
        if r.fenced_at > max_fence {
            let e = ValidationError::new("fenced_at", r.fenced_at, format!("must be at most {max_fence}"));
            return Err(CenterError::from(e).into());
        }
        let reg = self.store.register(&channel, &agent, now_ms(), self.lease.lease_ttl_ms, r.fenced_at).await?;
        if r.fenced_at > 0 {
            // A ledger that went back handed the agent an epoch its pools had seen.
            tracing::warn!(channel = %channel, fenced_at = r.fenced_at, epoch = reg.session.epoch,
                "agent registered above a pool fence: the ledger handed out an epoch again");
        }
        tracing::info!(channel = %channel, agent = %agent, epoch = reg.session.epoch, "agent registered");
        let schedules = self.store.schedules().await?;
        let by_id: std::collections::HashMap<&str, _> =
            schedules.iter().map(|(id, s, closed)| (id.as_str(), (*s, *closed))).collect();
        let schedule_of =
            |item_id: &str| by_id.get(item_id).map(|(s, closed)| pb_schedule(item_id.to_owned(), *s, *closed));
        Ok(Response::new(pb::RegisterAgentResponse {
            epoch: reg.session.epoch,
            lease_ttl_ms: self.lease.lease_ttl_ms,
            held: reg
                .held
                .into_iter()
                .map(|h| pb::ChannelHolding {
                    schedule: schedule_of(&h.item_id),
                    item_id: h.item_id,
                    held: h.held,
                    generation: h.generation,
                    in_doubt: h.in_doubt,
                    write_seq_floors: h.write_seq_floors,
                })
                .collect(),
            lease_expires_at_unix_ms: reg.session.lease_expires_at_ms,
            scheduled: schedules
                .iter()
                .filter(|(_, _, closed)| !closed)
                .map(|(id, s, closed)| pb_schedule(id.clone(), *s, *closed))
                .collect(),
            center_now_unix_ms: now_ms(),
        }))
    }

    async fn borrow(&self, request: Request<pb::BorrowRequest>) -> Res<pb::BorrowResponse> {
        let span = tracing::info_span!(
            "borrow",
            trace_id = trace_id(&request).unwrap_or_default(),
            request_id = tracing::field::Empty
        );
        inventory_net::trace::adopt_remote_parent(&span, request.metadata());
        self.borrow_inner(request).instrument(span).await
    }

    async fn borrow_many(&self, request: Request<pb::BorrowManyRequest>) -> Res<pb::BorrowManyResponse> {
        if self.faults.refuse_borrow_many.load(Ordering::Relaxed) {
            return Err(Status::unimplemented("BorrowMany is not served by this center"));
        }
        let span = tracing::info_span!("borrow_many", trace_id = trace_id(&request).unwrap_or_default());
        inventory_net::trace::adopt_remote_parent(&span, request.metadata());
        self.borrow_many_inner(request).instrument(span).await
    }

    async fn return_many(&self, request: Request<pb::ReturnManyRequest>) -> Res<pb::ReturnManyResponse> {
        if self.faults.refuse_return_many.load(Ordering::Relaxed) {
            return Err(Status::unimplemented("ReturnMany is not served by this center"));
        }
        let span = tracing::info_span!("return_many", trace_id = trace_id(&request).unwrap_or_default());
        inventory_net::trace::adopt_remote_parent(&span, request.metadata());
        self.return_many_inner(request).instrument(span).await
    }

    async fn r#return(&self, request: Request<pb::ReturnRequest>) -> Res<pb::ReturnResponse> {
        let span = tracing::info_span!(
            "return",
            trace_id = trace_id(&request).unwrap_or_default(),
            request_id = tracing::field::Empty
        );
        inventory_net::trace::adopt_remote_parent(&span, request.metadata());
        self.return_inner(request).instrument(span).await
    }
    async fn heartbeat(&self, request: Request<pb::HeartbeatRequest>) -> Res<pb::HeartbeatResponse> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        self.limits.call(channel.as_str(), 1)?;
        if FaultHooks::take(&self.faults.refuse_heartbeats) {
            return Err(Status::failed_precondition(format!(
                "stale epoch {} for channel {channel}: refused by a fault hook",
                r.epoch
            )));
        }
        let mut reports = Vec::with_capacity(r.pools.len());
        for (n, p) in r.pools.iter().enumerate() {
            // Field names are built only for an error: a report of thousands of pools
            // formats none.
            let item =
                ItemId::parse("item_id", &p.item_id).map_err(CenterError::from).map_err(in_pool(n, "item_id"))?;
            let count = |name: &str, value: u64| -> Result<u64, CenterError> {
                if value > MAX_QUANTITY {
                    let field = format!("pools[{n}].{name}");
                    return Err(ValidationError::new(field, value, format!("must be at most {MAX_QUANTITY}")).into());
                }
                Ok(value)
            };
            let counts = PoolCounts {
                available: count("available", p.available)?,
                reserved: count("reserved", p.reserved)?,
                sold: count("sold", p.sold)?,
            };
            // Stored as a signed 64-bit number; a larger one would wrap.
            if i64::try_from(p.generation).is_err() {
                let field = format!("pools[{n}].generation");
                let reason = format!("must be at most {}", i64::MAX);
                return Err(CenterError::from(ValidationError::new(field, p.generation, reason)).into());
            }
            let sell_rate_milli = rate("sell_rate_milli", p.sell_rate_milli).map_err(in_pool(n, "sell_rate_milli"))?;
            let max_segment = inventory_core::segments::MAX_SEGMENTS - 1;
            if p.lost_segments.len() > max_segment as usize {
                let field = format!("pools[{n}].lost_segments");
                let reason = format!("must name at most {max_segment} segments (one must be intact)");
                return Err(CenterError::from(ValidationError::new(field, p.lost_segments.len() as u64, reason)).into());
            }
            if let Some((i, s)) = p.lost_segments.iter().enumerate().find(|(_, s)| **s > max_segment) {
                let field = format!("pools[{n}].lost_segments[{i}]");
                let reason = format!("must be at most {max_segment}");
                return Err(CenterError::from(ValidationError::new(field, u64::from(*s), reason)).into());
            }
            let lost_segments = u32::try_from(p.lost_segments.len()).unwrap_or(u32::MAX);
            let report = PoolReport { counts, generation: p.generation, lost: p.lost, sell_rate_milli, lost_segments };
            let segments = segment_counts(n, &p.segments)?;
            let segment_seqs: Vec<(u32, u64)> = p.segments.iter().map(|s| (s.segment, s.write_seq)).collect();
            let write_seqs = inventory_core::pool::reported_write_seqs(p.write_seq, &segment_seqs);
            if let Some((_, seq)) = write_seqs.iter().find(|(_, seq)| i64::try_from(*seq).is_err()) {
                let field = format!("pools[{n}].write_seq");
                let reason = format!("must be at most {}", i64::MAX);
                return Err(CenterError::from(ValidationError::new(field, *seq, reason)).into());
            }
            reports.push(PoolReportIn { item, report, segments, write_seqs });
        }
        let out =
            self.store.heartbeat(&channel, r.epoch, &reports, r.last_report, now_ms(), self.lease.lease_ttl_ms).await?;
        if !reports.is_empty() {
            crate::history::History::sample_if_unsure(&self.history, &self.store, now_ms());
        }
        for (item, units) in &out.lost {
            // Only units really in doubt freeze the item: a pool lost while the channel
            // held nothing of it costs nothing.
            if *units > 0 {
                tracing::error!(channel = %channel, item = %item, in_doubt = units, "channel lost its pool; units in doubt");
            } else {
                tracing::warn!(channel = %channel, item = %item, "channel lost a pool that held nothing");
            }
        }
        Ok(Response::new(pb::HeartbeatResponse {
            lease_expires_at_unix_ms: out.session.lease_expires_at_ms,
            lease_ttl_ms: self.lease.lease_ttl_ms,
            in_doubt_items: out.in_doubt_items,
            center_now_unix_ms: now_ms(),
        }))
    }

    async fn describe_item(&self, request: Request<pb::DescribeItemRequest>) -> Res<pb::DescribeItemResponse> {
        self.faults.describes.fetch_add(1, Ordering::SeqCst);
        let own = own_channel(&request);
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let channel = if r.channel.is_empty() {
            None
        } else {
            Some(Channel::parse("channel", &r.channel).map_err(CenterError::from)?)
        };
        if let Some(c) = &channel {
            authorize(&own, c.as_str())?;
            self.limits.call(c.as_str(), 1)?;
        }
        let policy = self.store.policy(&item, channel.as_ref()).await?;
        let mut live = None;
        let mut d = pb_describe(policy);
        if let Some(c) = &channel {
            self.opening_allocation(&mut d, c, &mut live).await?;
        }
        Ok(Response::new(d))
    }

    async fn describe_items(&self, request: Request<pb::DescribeItemsRequest>) -> Res<pb::DescribeItemsResponse> {
        self.faults.describes.fetch_add(1, Ordering::SeqCst);
        if self.faults.refuse_describe_items.load(Ordering::Relaxed) {
            return Err(Status::unimplemented("DescribeItems is not served by this center"));
        }
        let own = own_channel(&request);
        let r = request.into_inner();
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        self.limits.call(channel.as_str(), 1)?;
        if r.item_ids.is_empty() || r.item_ids.len() > MAX_DESCRIBE_ITEMS {
            let reason = format!("must name 1 to {MAX_DESCRIBE_ITEMS} items");
            return Err(CenterError::from(ValidationError::new("item_ids", r.item_ids.len() as u64, reason)).into());
        }
        let items = r
            .item_ids
            .iter()
            .enumerate()
            .map(|(i, id)| ItemId::parse(&format!("item_ids[{i}]"), id))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CenterError::from)?;
        let policies = self.store.policies(&items, &channel).await?;
        let mut out = pb::DescribeItemsResponse::default();
        let mut live = None;
        for (item, policy) in items.iter().zip(policies) {
            match policy {
                Some(p) => {
                    let mut d = pb_describe(p);
                    self.opening_allocation(&mut d, &channel, &mut live).await?;
                    out.items.push(d);
                }
                None => out.not_found.push(item.to_string()),
            }
        }
        Ok(Response::new(out))
    }

    type WatchChannelStream = WatchStream;

    async fn watch_channel(&self, request: Request<pb::WatchChannelRequest>) -> Res<Self::WatchChannelStream> {
        self.watch_channel_inner(request).await
    }
}

impl CenterService {
    async fn borrow_inner(&self, request: Request<pb::BorrowRequest>) -> Res<pb::BorrowResponse> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        self.limits.call(channel.as_str(), 1)?;
        let quantity = Quantity::parse("quantity", r.quantity).map_err(CenterError::from)?;
        let request_id = RequestId::parse("request_id", &r.request_id).map_err(CenterError::from)?;
        tracing::Span::current().record("request_id", request_id.as_str());
        self.refuse_if_too_old(&request_id)?;
        self.refuse_if_beyond_ledger(&item)?;
        let rate = BorrowRate { sell_rate_milli: rate("sell_rate_milli", r.sell_rate_milli)?, now_ms: now_ms() };
        let out = if *self.faults.hold_borrows.borrow() {
            // Applied by a task of its own, whether or not this call is still awaited.
            self.faults.held_borrows.fetch_add(1, Ordering::SeqCst);
            let mut gate = self.faults.hold_borrows.subscribe();
            let (store, item, channel) = (Arc::clone(&self.store), item.clone(), channel.clone());
            let (epoch, request_id) = (r.epoch, request_id.clone());
            tokio::spawn(async move {
                let _ = gate.wait_for(|held| !held).await;
                store.borrow(&item, &channel, epoch, quantity, &request_id, rate).await
            })
            .await
            .map_err(|e| CenterError::Internal(format!("held borrow: {e}")))??
        } else {
            self.store.borrow(&item, &channel, r.epoch, quantity, &request_id, rate).await?
        };
        tracing::debug!(item = %item, channel = %channel, granted = out.granted, replayed = out.replayed, "borrow");
        if !out.replayed && !out.capped && out.granted < quantity.get() && out.center_available == 0 {
            // End of sale: this channel is short and the center is dry. Ask the others
            // to give back what they are not selling.
            self.events
                .publish(LedgerEvent::ReturnRequested { item_id: item.to_string(), starving: channel.to_string() });
        }
        if FaultHooks::take(&self.faults.lose_borrow_replies) {
            tracing::warn!(item = %item, channel = %channel, "fault hook: borrow committed, reply withheld");
            std::future::pending::<()>().await;
        }
        Ok(Response::new(pb::BorrowResponse {
            granted: out.granted,
            center_available: out.center_available,
            replayed: out.replayed,
            opens_at_unix_ms: out.opens_at_ms,
        }))
    }

    async fn return_inner(&self, request: Request<pb::ReturnRequest>) -> Res<pb::ReturnResponse> {
        let own = own_channel(&request);
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        authorize(&own, channel.as_str())?;
        self.limits.call(channel.as_str(), 1)?;
        let quantity = Quantity::parse("quantity", r.quantity).map_err(CenterError::from)?;
        let request_id = RequestId::parse("request_id", &r.request_id).map_err(CenterError::from)?;
        tracing::Span::current().record("request_id", request_id.as_str());
        self.refuse_if_too_old(&request_id)?;
        let write_seqs = inventory_core::pool::return_write_seqs(&r.write_seq_floors).map_err(CenterError::from)?;
        if !write_seqs.is_empty() {
            let seqs: Vec<(&ItemId, u32, u64)> = write_seqs.iter().map(|(s, w)| (&item, *s, *w)).collect();
            self.store.raise_write_seqs(&channel, &seqs).await?;
        }
        let out = self.store.give_back(&item, &channel, r.epoch, quantity, &request_id).await?;
        if !out.replayed {
            self.events.publish(LedgerEvent::Restocked {
                item_id: item.to_string(),
                center_available: out.center_available,
                from_channel: Some(channel.to_string()),
            });
        }
        Ok(Response::new(pb::ReturnResponse { center_available: out.center_available, replayed: out.replayed }))
    }
}

/// Most items one DescribeItems names (as many as a BorrowMany's lines).
pub const MAX_DESCRIBE_ITEMS: usize = MAX_BORROW_LINES;

/// An item's policy as DescribeItem answers it.
fn pb_describe(policy: crate::store::ItemPolicy) -> pb::DescribeItemResponse {
    pb::DescribeItemResponse {
        item_id: policy.item.item_id,
        per_user_limit: policy.item.state.per_user_limit,
        reservation_ttl_ms: policy.item.state.reservation_ttl_ms,
        watermarks: Some(pb_watermarks(policy.watermarks)),
        rate_batching: policy.rate_batching.map(|r| pb_rate_batching(Some(r))),
        limit_scope: pb_limit_scope(policy.item.limit.scope).into(),
        registry_fallback: pb_registry_fallback(policy.item.limit.fallback).into(),
        center_available: policy.item.state.available,
        closed: policy.item.state.closed,
        held: policy.allocation.map_or(0, |a| a.held()),
        generation: policy.allocation.map_or(0, |a| a.generation),
        in_doubt: policy.allocation.map_or(0, |a| a.in_doubt),
        segments: policy.item.segments,
        opens_at_unix_ms: policy.item.plan.schedule.opens_at_ms,
        closes_at_unix_ms: policy.item.plan.schedule.closes_at_ms,
        prestock_lead_ms: policy.item.plan.schedule.prestock_lead_ms,
        center_now_unix_ms: now_ms(),
        // Filled for a channel's scheduled item before its opening (`opening_allocation`).
        opening_allocation: 0,
        write_seq_floors: policy.write_seq_floors,
        center_reserve: policy.item.plan.center_reserve,
    }
}

/// The trace id of a W3C `traceparent` header, when the caller sent one.
fn trace_id<T>(req: &Request<T>) -> Option<String> {
    let v = req.metadata().get("traceparent")?.to_str().ok()?;
    let mut parts = v.split('-');
    let (_version, trace) = (parts.next()?, parts.next()?);
    (trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit())).then(|| trace.to_owned())
}

/// A sell rate from an agent (units/s × 1000): one above a billion units a second is no
/// rate any pool sells at.
/// Names a report's field in its error, `pools[n].<name>`: built only when the check
/// failed.
fn in_pool(n: usize, name: &'static str) -> impl FnOnce(CenterError) -> CenterError {
    move |e| match e {
        CenterError::Invalid(v) => CenterError::Invalid(ValidationError { field: format!("pools[{n}].{name}"), ..v }),
        e => e,
    }
}

fn rate(field: &str, value: u64) -> Result<u64, CenterError> {
    let max = MAX_QUANTITY.saturating_mul(1_000);
    if value > max {
        return Err(ValidationError::new(field, value, format!("must be at most {max}")).into());
    }
    Ok(value)
}

/// A report's segments, checked: at most [`MAX_SEGMENTS`] of them, each numbered below it,
/// counters within [`MAX_QUANTITY`].
///
/// [`MAX_SEGMENTS`]: inventory_core::segments::MAX_SEGMENTS
fn segment_counts(
    n: usize,
    segments: &[pb::SegmentCounts],
) -> Result<Vec<inventory_core::segments::SegmentCounts>, CenterError> {
    use inventory_core::segments::{MAX_SEGMENTS, SegmentCounts};
    if segments.len() > MAX_SEGMENTS as usize {
        let reason = format!("must list at most {MAX_SEGMENTS} segments");
        return Err(ValidationError::new(format!("pools[{n}].segments"), segments.len() as u64, reason).into());
    }
    segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let field = |name: &str| format!("pools[{n}].segments[{i}].{name}");
            if s.segment >= MAX_SEGMENTS {
                let reason = format!("must be below {MAX_SEGMENTS}");
                return Err(ValidationError::new(field("segment"), u64::from(s.segment), reason).into());
            }
            for (name, value) in [("available", s.available), ("reserved", s.reserved), ("sold", s.sold)] {
                if value > MAX_QUANTITY {
                    return Err(
                        ValidationError::new(field(name), value, format!("must be at most {MAX_QUANTITY}")).into()
                    );
                }
            }
            let counts = PoolCounts { available: s.available, reserved: s.reserved, sold: s.sold };
            Ok(SegmentCounts { segment: s.segment, counts, lost: s.lost })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::trace_id;

    #[test]
    fn trace_id_comes_from_a_w3c_traceparent() {
        let mut r = tonic::Request::new(());
        assert_eq!(trace_id(&r), None);
        let id = "4bf92f3577b34da6a3ce929d0e0e4736";
        r.metadata_mut().insert("traceparent", format!("00-{id}-00f067aa0ba902b7-01").parse().unwrap());
        assert_eq!(trace_id(&r).as_deref(), Some(id));
        r.metadata_mut().insert("traceparent", "00-nothex-00f067aa0ba902b7-01".parse().unwrap());
        assert_eq!(trace_id(&r), None);
    }
}
