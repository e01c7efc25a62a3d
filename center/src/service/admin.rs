//! The Admin service: what operators (and `invctl`) call.

use std::sync::Arc;

use inventory_core::buyers::{LimitScope, RegistryFallback};
use inventory_core::ids::MAX_QUANTITY;
use inventory_core::ledger::{ChannelShare, ChannelShares, Finding};
use inventory_core::schedule;
use inventory_core::watermarks::{RateBatching, WatermarkError, Watermarks};
use inventory_core::{Channel, ItemId, Quantity, RequestId, ValidationError};
use inventory_proto::v1 as pb;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::{current_batch, lease_fields, pb_item, pb_rate_batching, pb_watermarks};
use crate::clock::now_ms;
use crate::error::CenterError;
use crate::events::{EventHub, LedgerEvent};
use crate::service::center::LeaseSettings;
use crate::store::{LedgerStore, LimitSettings, NewItem, SalePlan};

pub const DEFAULT_RESERVATION_TTL_MS: u64 = 300_000;
pub const MIN_RESERVATION_TTL_MS: u64 = 100;
pub const MAX_RESERVATION_TTL_MS: u64 = 86_400_000;

pub struct AdminService {
    store: Arc<dyn LedgerStore>,
    events: EventHub,
    lease: LeaseSettings,
    /// Stuck drift (the console's sampler): Reconcile reports it as a violation.
    history: Arc<crate::history::History>,
}

impl AdminService {
    pub fn new(
        store: Arc<dyn LedgerStore>,
        events: EventHub,
        lease: LeaseSettings,
        history: Arc<crate::history::History>,
    ) -> Self {
        Self { store, events, lease, history }
    }
}

type Res<T> = Result<Response<T>, Status>;

/// Parses CreateItem into a validated [`NewItem`], applying the documented defaults;
/// `now_ms` (the center's clock) for the schedule's checks.
pub fn parse_new_item(r: &pb::CreateItemRequest, now_ms: i64) -> Result<NewItem, CenterError> {
    let item_id = ItemId::parse("item_id", &r.item_id)?;
    let total = Quantity::parse("total", r.total)?;
    let per_user_limit = match r.per_user_limit {
        0 => 1,
        n if n > MAX_QUANTITY => {
            return Err(ValidationError::new("per_user_limit", n, format!("must be at most {MAX_QUANTITY}")).into());
        }
        n => n,
    };
    let reservation_ttl_ms = match r.reservation_ttl_ms {
        0 => DEFAULT_RESERVATION_TTL_MS,
        n if !(MIN_RESERVATION_TTL_MS..=MAX_RESERVATION_TTL_MS).contains(&n) => {
            return Err(ValidationError::new(
                "reservation_ttl_ms",
                n,
                format!("must be between {MIN_RESERVATION_TTL_MS} and {MAX_RESERVATION_TTL_MS}"),
            )
            .into());
        }
        n => n,
    };
    let watermarks = match &r.watermarks {
        Some(w) => Watermarks::new(w.low, w.high, w.batch)?,
        None => Watermarks::default_for_total(total.get()),
    };
    // Batches follow the sell rate unless the operator gave fixed watermarks (or says so).
    let rate_batching = match &r.rate_batching {
        Some(rb) if rb.enabled => Some(parse_rate_batching(rb, total.get(), "rate_batching.")?),
        Some(_) => None,
        None if r.watermarks.is_some() => None,
        None => Some(RateBatching::default_for_total(total.get())),
    };
    let segments = inventory_core::segments::parse("segments", r.segments)?;
    let limit = parse_limit(r)?;
    let plan = SalePlan {
        schedule: schedule::parse(r.opens_at_unix_ms, r.closes_at_unix_ms, r.prestock_lead_ms, now_ms)?,
        center_reserve: schedule::parse_reserve(r.center_reserve, total.get())?,
    };
    let shares = parse_shares(&r.channel_shares, total.get(), plan.center_reserve)?;
    Ok(NewItem {
        item_id,
        total,
        per_user_limit,
        reservation_ttl_ms,
        watermarks,
        rate_batching,
        segments,
        limit,
        plan,
        shares,
    })
}

/// `channel_shares`, checked against the total and the reserve (`ChannelShares::parse`).
fn parse_shares(raw: &[pb::ChannelShare], total: u64, reserve: u64) -> Result<ChannelShares, CenterError> {
    let shares: Vec<ChannelShare> = raw
        .iter()
        .map(|s| ChannelShare {
            channel: s.channel.clone(),
            weight: s.weight,
            cap_units: s.cap_units,
            floor_units: s.floor_units,
        })
        .collect();
    Ok(ChannelShares::parse(&shares, total, reserve)?)
}

fn parse_limit(r: &pb::CreateItemRequest) -> Result<LimitSettings, CenterError> {
    let scope = LimitScope::from_number(i64::from(r.limit_scope)).ok_or_else(|| {
        ValidationError::new(
            "limit_scope",
            i64::from(r.limit_scope),
            "must be LIMIT_SCOPE_CHANNEL or LIMIT_SCOPE_GLOBAL",
        )
    })?;
    let fallback = RegistryFallback::from_number(i64::from(r.registry_fallback)).ok_or_else(|| {
        ValidationError::new(
            "registry_fallback",
            i64::from(r.registry_fallback),
            "must be REGISTRY_FALLBACK_REFUSE or REGISTRY_FALLBACK_CHANNEL",
        )
    })?;
    if scope == LimitScope::Channel && fallback != RegistryFallback::Refuse {
        // A per-channel limit never asks the registry: a fallback would be silently ignored.
        let reason = "applies to LIMIT_SCOPE_GLOBAL items only";
        return Err(ValidationError::new("registry_fallback", i64::from(r.registry_fallback), reason).into());
    }
    Ok(LimitSettings { scope, fallback })
}

/// Validates rate-following bounds; `prefix` names the message in errors.
fn parse_rate_batching(rb: &pb::RateBatching, total: u64, prefix: &str) -> Result<RateBatching, CenterError> {
    RateBatching::new(rb.min_batch, rb.max_batch, rb.target_ms, total).map_err(|e| match e {
        WatermarkError::Invalid(v) => CenterError::from(ValidationError { field: format!("{prefix}{}", v.field), ..v }),
        other => CenterError::from(other),
    })
}

fn pb_segment(g: &inventory_core::segments::SegmentCounts) -> pb::SegmentCounts {
    pb::SegmentCounts {
        segment: g.segment,
        available: g.counts.available,
        reserved: g.counts.reserved,
        sold: g.counts.sold,
        lost: g.lost,
        // Operators' views do not show the sequences.
        write_seq: 0,
    }
}

fn pb_finding(f: Finding) -> pb::Violation {
    pb::Violation { item_id: f.item_id, channel: f.channel, invariant: f.invariant, detail: f.detail }
}

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn create_item(&self, request: Request<pb::CreateItemRequest>) -> Res<pb::CreateItemResponse> {
        let now = now_ms();
        let new = parse_new_item(request.get_ref(), now)?;
        let (record, created) = self.store.create_item(&new, now).await?;
        if created {
            tracing::info!(item = %new.item_id, total = new.total.get(), opens_at = new.plan.schedule.opens_at_ms, closes_at = new.plan.schedule.closes_at_ms, "item created");
            if record.plan.schedule.is_scheduled() {
                // Agents load it now, before any buyer asks.
                self.events.publish(LedgerEvent::scheduled(&record));
            }
        }
        Ok(Response::new(pb::CreateItemResponse { item: Some(pb_item(&record)), created }))
    }

    async fn add_stock(&self, request: Request<pb::AddStockRequest>) -> Res<pb::AddStockResponse> {
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let quantity = Quantity::parse("quantity", r.quantity).map_err(CenterError::from)?;
        let request_id = RequestId::parse("request_id", &r.request_id).map_err(CenterError::from)?;
        // Errors are logged inside this span, with the request id.
        let span = tracing::info_span!("add_stock", request_id = request_id.as_str());
        let (record, replayed) = self
            .store
            .add_stock(&item, quantity, &request_id)
            .instrument(span.clone())
            .await
            .map_err(|e| span.in_scope(|| Status::from(e)))?;
        if !replayed {
            self.events.publish(LedgerEvent::Restocked {
                item_id: item.to_string(),
                center_available: record.state.available,
                from_channel: None,
            });
        }
        Ok(Response::new(pb::AddStockResponse { item: Some(pb_item(&record)), replayed }))
    }

    async fn get_item(&self, request: Request<pb::GetItemRequest>) -> Res<pb::GetItemResponse> {
        let item = ItemId::parse("item_id", &request.get_ref().item_id).map_err(CenterError::from)?;
        let ledger = self.store.item_ledger(&item).await?;
        let now = now_ms();
        let channels = ledger
            .channels
            .iter()
            .map(|c| {
                let (epoch, lease_expires, live) = lease_fields(c.session.as_ref(), now);
                let a = &c.allocation;
                pb::ChannelAllocation {
                    channel: c.channel.clone(),
                    held: a.held(),
                    granted: a.granted,
                    returned: a.returned,
                    reclaimed: a.reclaimed,
                    reported_available: a.reported.available,
                    reported_reserved: a.reported.reserved,
                    reported_sold: a.reported.sold,
                    reported_at_unix_ms: a.reported_at_ms,
                    drift: a.drift(),
                    epoch,
                    lease_expires_at_unix_ms: lease_expires,
                    lease_live: live,
                    watermarks: Some(pb_watermarks(c.watermarks)),
                    in_doubt: a.in_doubt,
                    generation: a.generation,
                    sell_rate_milli: a.sell_rate_milli,
                    current_batch: current_batch(
                        &ledger.item,
                        c.watermarks_overridden.then_some(c.watermarks),
                        a.sell_rate_milli,
                    ),
                }
            })
            .collect();
        // Readiness needs every registered channel: read only while the item is before its opening.
        let readiness = if crate::readiness::before_opening(&ledger.item, now) {
            let sessions = self.store.channels().await?;
            let sessions = sessions.iter().map(|c| (c.channel.as_str(), &c.session));
            crate::readiness::readiness(&ledger.item, &ledger.channels, sessions, now).unwrap_or_default()
        } else {
            Vec::new()
        };
        let readiness = readiness
            .into_iter()
            .map(|r| pb::ChannelReadiness {
                channel: r.channel,
                allocated: r.allocated,
                stocked: r.stocked,
                agent_attached: r.agent_attached,
            })
            .collect();
        Ok(Response::new(pb::GetItemResponse {
            item: Some(pb_item(&ledger.item)),
            channels,
            center_now_unix_ms: now,
            readiness,
        }))
    }

    async fn list_items(&self, _request: Request<pb::ListItemsRequest>) -> Res<pb::ListItemsResponse> {
        let items = self.store.list_items().await?;
        Ok(Response::new(pb::ListItemsResponse { items: items.iter().map(pb_item).collect() }))
    }

    async fn set_watermarks(&self, request: Request<pb::SetWatermarksRequest>) -> Res<pb::SetWatermarksResponse> {
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let channel = if r.channel.is_empty() {
            None
        } else {
            Some(Channel::parse("channel", &r.channel).map_err(CenterError::from)?)
        };
        if let Some(rb) = &r.rate_batching {
            if let Some(c) = &channel {
                let reason = "must be empty with rate_batching (its bounds are per item)";
                return Err(CenterError::from(ValidationError::new("channel", c.as_str(), reason)).into());
            }
            // All three 0: keep the fixed watermarks as they are.
            let fixed = if (r.low, r.high, r.batch) == (0, 0, 0) {
                None
            } else {
                Some(Watermarks::new(r.low, r.high, r.batch).map_err(CenterError::from)?)
            };
            let total = self.store.policy(&item, None).await?.item.state.total;
            let bounds = if rb.enabled { Some(parse_rate_batching(rb, total, "rate_batching.")?) } else { None };
            self.store.set_rate_batching(&item, bounds, fixed).await?;
            tracing::info!(item = %item, rate_batching = ?bounds, fixed = ?fixed, "rate batching set");
            self.events.publish(LedgerEvent::Watermarks { item_id: item.to_string(), channel: None });
            let wm = self.store.policy(&item, None).await?.watermarks;
            return Ok(Response::new(pb::SetWatermarksResponse { watermarks: Some(pb_watermarks(wm)) }));
        }
        let wm = Watermarks::new(r.low, r.high, r.batch).map_err(CenterError::from)?;
        self.store.set_watermarks(&item, channel.as_ref(), wm).await?;
        tracing::info!(item = %item, channel = channel.as_ref().map_or("", |c| c.as_str()), low = wm.low, high = wm.high, batch = wm.batch, "watermarks set");
        self.events
            .publish(LedgerEvent::Watermarks { item_id: item.to_string(), channel: channel.map(|c| c.to_string()) });
        Ok(Response::new(pb::SetWatermarksResponse { watermarks: Some(pb_watermarks(wm)) }))
    }

    async fn get_watermarks(&self, request: Request<pb::GetWatermarksRequest>) -> Res<pb::GetWatermarksResponse> {
        let item = ItemId::parse("item_id", &request.get_ref().item_id).map_err(CenterError::from)?;
        let (default, overrides) = self.store.watermarks(&item).await?;
        let rate_batching = self.store.policy(&item, None).await?.item.rate_batching;
        Ok(Response::new(pb::GetWatermarksResponse {
            rate_batching: Some(pb_rate_batching(rate_batching)),
            default_watermarks: Some(pb_watermarks(default)),
            overrides: overrides
                .into_iter()
                .map(|(channel, w)| pb::ChannelWatermarks { channel, watermarks: Some(pb_watermarks(w)) })
                .collect(),
        }))
    }

    async fn reconcile(&self, request: Request<pb::ReconcileRequest>) -> Res<pb::ReconcileResponse> {
        let r = request.into_inner();
        let item = if r.item_id.is_empty() {
            None
        } else {
            Some(ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?)
        };
        let rec = self.store.reconcile(item.as_ref()).await?;
        let mut violations: Vec<pb::Violation> = rec.check.violations.into_iter().map(pb_finding).collect();
        // A drift nothing in flight explains is a broken promise, not noise: stock
        // stranded at the center (positive), or pools holding what the ledger lost (negative).
        for (item_id, channel, drift) in self.history.stuck_drifts() {
            if item.as_ref().is_some_and(|i| i.as_str() != item_id) {
                continue;
            }
            let message = if drift > 0 {
                format!(
                    "channel {channel} is counted with {drift} units of item {item_id} that are on none of its shelves, \
                     and nothing in flight explains it (stranded stock)"
                )
            } else {
                format!(
                    "the pool of channel {channel} holds {} units of item {item_id} more than the ledger counts with it \
                     (the ledger lost commits?); the item is not lent until they are re-learned",
                    drift.unsigned_abs()
                )
            };
            violations.push(pb::Violation {
                item_id,
                channel,
                invariant: if drift > 0 { "stranded".into() } else { "beyond_ledger".into() },
                detail: message,
            });
        }
        Ok(Response::new(pb::ReconcileResponse {
            ok: violations.is_empty(),
            violations,
            drifts: rec.check.drifts.into_iter().map(pb_finding).collect(),
            items_checked: rec.items_checked,
            in_doubt: rec.check.in_doubt.into_iter().map(pb_finding).collect(),
        }))
    }

    async fn list_channels(&self, request: Request<pb::ListChannelsRequest>) -> Res<pb::ListChannelsResponse> {
        let wanted = &request.get_ref().channel;
        if !wanted.is_empty() {
            Channel::parse("channel", wanted).map_err(CenterError::from)?;
        }
        let now = now_ms();
        let channels = self
            .store
            .channels()
            .await?
            .into_iter()
            .filter(|c| wanted.is_empty() || c.channel == *wanted)
            .map(|c| pb::ChannelInfo {
                agent_id: c.session.agent_id.clone(),
                epoch: c.session.epoch,
                lease_expires_at_unix_ms: c.session.lease_expires_at_ms,
                lease_live: c.session.lease_live(now),
                last_heartbeat_unix_ms: c.session.last_heartbeat_ms,
                items: c
                    .allocations
                    .iter()
                    .map(|(item_id, a)| pb::ChannelItem {
                        item_id: item_id.clone(),
                        held: a.held(),
                        reported_available: a.reported.available,
                        reported_reserved: a.reported.reserved,
                        reported_sold: a.reported.sold,
                        drift: a.drift(),
                        in_doubt: a.in_doubt,
                        sell_rate_milli: a.sell_rate_milli,
                        current_batch: 0,
                        segments: c
                            .segments
                            .iter()
                            .find(|(i, _)| i == item_id)
                            .map(|(_, s)| s.iter().map(pb_segment).collect())
                            .unwrap_or_default(),
                    })
                    .collect(),
                channel: c.channel,
            })
            .collect::<Vec<_>>();
        // The batch of each pool that reports a rate, by its item's settings.
        let mut channels = channels;
        for info in &mut channels {
            let channel = Channel::parse("channel", &info.channel).map_err(CenterError::from)?;
            for it in info.items.iter_mut().filter(|it| it.sell_rate_milli > 0) {
                let item = ItemId::parse("item_id", &it.item_id).map_err(CenterError::from)?;
                let p = self.store.policy(&item, Some(&channel)).await?;
                it.current_batch =
                    inventory_core::watermarks::effective(p.watermarks, p.rate_batching, it.sell_rate_milli).batch;
            }
        }
        if !wanted.is_empty() && channels.is_empty() {
            return Err(CenterError::NotFound { kind: "channel", id: wanted.clone() }.into());
        }
        Ok(Response::new(pb::ListChannelsResponse { channels }))
    }

    async fn close_item(&self, request: Request<pb::CloseItemRequest>) -> Res<pb::CloseItemResponse> {
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        if !r.closed {
            let closes_at = self.store.policy(&item, None).await?.item.plan.schedule.closes_at_ms;
            if closes_at > 0 && closes_at <= now_ms() {
                return Err(CenterError::Precondition(format!(
                    "item {:?} closed by its schedule at closes_at_unix_ms {closes_at}; move it later with SetSchedule first",
                    item.as_str()
                ))
                .into());
            }
        }
        let record = self.store.set_closed(&item, r.closed).await?;
        tracing::info!(item = %item, closed = r.closed, "item closed state changed");
        // Agents re-read the item's settings; a reopened item may sell again.
        self.events.publish(LedgerEvent::Watermarks { item_id: item.to_string(), channel: None });
        if r.closed {
            // The end of the sale, as at `closes_at` (`closer.rs`): every channel gives its
            // idle units back (no starving channel), reservations still confirm.
            self.events.publish(LedgerEvent::ReturnRequested { item_id: item.to_string(), starving: String::new() });
        }
        Ok(Response::new(pb::CloseItemResponse { item: Some(pb_item(&record)) }))
    }

    async fn set_schedule(&self, request: Request<pb::SetScheduleRequest>) -> Res<pb::SetScheduleResponse> {
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let now = now_ms();
        let record = self.store.set_schedule(&item, r.opens_at_unix_ms, r.closes_at_unix_ms, now).await?;
        let s = record.plan.schedule;
        tracing::info!(item = %item, opens_at = s.opens_at_ms, closes_at = s.closes_at_ms, "schedule set");
        self.events.publish(LedgerEvent::scheduled(&record));
        Ok(Response::new(pb::SetScheduleResponse { item: Some(pb_item(&record)), center_now_unix_ms: now }))
    }

    async fn resolve_in_doubt(&self, request: Request<pb::ResolveInDoubtRequest>) -> Res<pb::ResolveInDoubtResponse> {
        let r = request.into_inner();
        let item = ItemId::parse("item_id", &r.item_id).map_err(CenterError::from)?;
        let channel = Channel::parse("channel", &r.channel).map_err(CenterError::from)?;
        if r.sold > MAX_QUANTITY {
            return Err(CenterError::from(ValidationError::new(
                "sold",
                r.sold,
                format!("must be at most {MAX_QUANTITY}"),
            ))
            .into());
        }
        let (record, returned) = self.store.resolve_in_doubt(&item, &channel, r.sold).await?;
        tracing::warn!(item = %item, channel = %channel, written_off = r.sold, returned, "in-doubt units resolved");
        self.events.publish(LedgerEvent::InDoubtResolved { item_id: item.to_string(), channel: channel.to_string() });
        if returned > 0 {
            self.events.publish(LedgerEvent::Restocked {
                item_id: item.to_string(),
                center_available: record.state.available,
                from_channel: Some(channel.to_string()),
            });
        }
        Ok(Response::new(pb::ResolveInDoubtResponse {
            item: Some(pb_item(&record)),
            returned_to_center: returned,
            written_off: r.sold,
        }))
    }

    async fn reclaim(&self, request: Request<pb::ReclaimRequest>) -> Res<pb::ReclaimResponse> {
        let channel = Channel::parse("channel", &request.get_ref().channel).map_err(CenterError::from)?;
        let out = self.store.reclaim(&channel, now_ms(), self.lease.reclaim_grace_ms).await?;
        for (item_id, units, center_available, in_doubt) in &out.items {
            tracing::warn!(channel = %channel, item = %item_id, units, in_doubt, new_epoch = out.new_epoch, "reclaimed");
            if *units > 0 {
                self.events.publish(LedgerEvent::Restocked {
                    item_id: item_id.clone(),
                    center_available: *center_available,
                    from_channel: Some(channel.to_string()),
                });
            }
        }
        Ok(Response::new(pb::ReclaimResponse {
            items: out
                .items
                .into_iter()
                .map(|(item_id, reclaimed, _, in_doubt)| pb::ReclaimedItem { item_id, reclaimed, in_doubt })
                .collect(),
            new_epoch: out.new_epoch,
        }))
    }

    async fn remove_channel(&self, request: Request<pb::RemoveChannelRequest>) -> Res<pb::RemoveChannelResponse> {
        let channel = Channel::parse("channel", &request.get_ref().channel).map_err(CenterError::from)?;
        let removed = self.store.remove_channel(&channel, now_ms()).await?;
        tracing::warn!(channel = %channel, last_epoch = removed.last_epoch, items = removed.item_ids.len(), "channel removed");
        Ok(Response::new(pb::RemoveChannelResponse {
            channel: channel.to_string(),
            last_epoch: removed.last_epoch,
            item_ids: removed.item_ids,
        }))
    }
}
