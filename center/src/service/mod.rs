//! gRPC services of the center. Each handler parses the request into domain types (the
//! edge), calls the store, and maps the result; no ledger rule lives here.

pub mod admin;
pub mod center;

use inventory_core::buyers::{LimitScope, RegistryFallback};
use inventory_core::ledger::ChannelSession;
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_proto::v1 as pb;

use crate::store::ItemRecord;

pub(crate) fn pb_watermarks(w: Watermarks) -> pb::Watermarks {
    pb::Watermarks { low: w.low, high: w.high, batch: w.batch }
}

pub(crate) fn pb_rate_batching(r: Option<RateBatching>) -> pb::RateBatching {
    r.map_or_else(pb::RateBatching::default, |r| pb::RateBatching {
        enabled: true,
        min_batch: r.min_batch,
        max_batch: r.max_batch,
        target_ms: r.target_ms,
    })
}

/// The batch a channel's pool borrows now, by the rate it last reported.
pub(crate) fn current_batch(item: &ItemRecord, own: Option<Watermarks>, sell_rate_milli: u64) -> u64 {
    match own {
        Some(w) => w.batch,
        None => inventory_core::watermarks::effective(item.watermarks, item.rate_batching, sell_rate_milli).batch,
    }
}

pub(crate) fn pb_item(r: &ItemRecord) -> pb::Item {
    pb::Item {
        item_id: r.item_id.clone(),
        total: r.state.total,
        available: r.state.available,
        per_user_limit: r.state.per_user_limit,
        reservation_ttl_ms: r.state.reservation_ttl_ms,
        closed: r.state.closed,
        watermarks: Some(pb_watermarks(r.watermarks)),
        held: r.held,
        written_off: r.state.written_off,
        rate_batching: Some(pb_rate_batching(r.rate_batching)),
        segments: r.segments,
        limit_scope: pb_limit_scope(r.limit.scope).into(),
        registry_fallback: pb_registry_fallback(r.limit.fallback).into(),
        opens_at_unix_ms: r.plan.schedule.opens_at_ms,
        closes_at_unix_ms: r.plan.schedule.closes_at_ms,
        prestock_lead_ms: r.plan.schedule.prestock_lead_ms,
        center_reserve: r.plan.center_reserve,
        channel_shares: r
            .shares
            .iter()
            .map(|s| pb::ChannelShare {
                channel: s.channel.clone(),
                weight: s.weight,
                cap_units: s.cap_units,
                floor_units: s.floor_units,
            })
            .collect(),
    }
}

pub(crate) fn pb_schedule(item_id: String, s: inventory_core::schedule::Schedule, closed: bool) -> pb::ItemSchedule {
    pb::ItemSchedule {
        item_id,
        opens_at_unix_ms: s.opens_at_ms,
        closes_at_unix_ms: s.closes_at_ms,
        prestock_lead_ms: s.prestock_lead_ms,
        closed,
    }
}

pub(crate) fn lease_fields(s: Option<&ChannelSession>, now_ms: i64) -> (u64, i64, bool) {
    s.map_or((0, 0, false), |s| (s.epoch, s.lease_expires_at_ms, s.lease_live(now_ms)))
}

pub(crate) fn pb_limit_scope(s: LimitScope) -> pb::LimitScope {
    match s {
        LimitScope::Channel => pb::LimitScope::Channel,
        LimitScope::Global => pb::LimitScope::Global,
    }
}

pub(crate) fn pb_registry_fallback(f: RegistryFallback) -> pb::RegistryFallback {
    match f {
        RegistryFallback::Refuse => pb::RegistryFallback::Refuse,
        RegistryFallback::Channel => pb::RegistryFallback::Channel,
    }
}
