//! Whether a scheduled item's channels are ready for its opening, as operators see it
//! (the metrics, the console's feed and GetItem): per channel, the opening allocation the
//! center would answer now, what the channel holds of the item, and whether an agent is
//! attached (its lease is live).
//!
//! Read-only: the allocation is `ItemRecord::opening_allocation` (by the item's shares, or
//! an even split without any), the rule DescribeItem applies, over the channels whose
//! lease is live at `now_ms`, so what is shown is what a channel asking now would be told. Shown only while the item has not
//! opened (and is not closed): after the opening the ordinary rules stock the pools and
//! the allocation means nothing.

use inventory_core::ledger::ChannelSession;
use inventory_core::schedule::{Phase, phase};
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use serde::Serialize;

use crate::http::{LedgerView, family};
use crate::store::{ChannelRecord, ItemLedger, ItemRecord};

/// One channel's readiness for an item's opening.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChannelReadiness {
    pub channel: String,
    /// The units the channel stocks at the start of the lead (its opening allocation now).
    pub allocated: u64,
    /// The units it holds of the item (granted − returned − reclaimed).
    pub stocked: u64,
    /// Its lease is live: an agent is attached and will stock.
    pub agent_attached: bool,
}

/// Whether `item` is before its opening at `now_ms` (the center's clock), and not closed.
pub fn before_opening(item: &ItemRecord, now_ms: i64) -> bool {
    item.plan.schedule.opens_at_ms > now_ms && !item.state.closed
}

/// The readiness of `item`'s channels at `now_ms`, by channel name: every registered
/// channel (`sessions`) and every channel with a ledger line of the item (`lines`).
/// `None` unless the item is [`before_opening`].
pub fn readiness<'a>(
    item: &ItemRecord,
    lines: &[ChannelRecord],
    sessions: impl IntoIterator<Item = (&'a str, &'a ChannelSession)>,
    now_ms: i64,
) -> Option<Vec<ChannelReadiness>> {
    if !before_opening(item, now_ms) {
        return None;
    }
    let mut channels: std::collections::BTreeMap<&str, bool> =
        sessions.into_iter().map(|(name, s)| (name, s.lease_live(now_ms))).collect();
    for line in lines {
        let live = line.session.as_ref().is_some_and(|s| s.lease_live(now_ms));
        let attached = channels.entry(line.channel.as_str()).or_insert(live);
        *attached |= live;
    }
    let live: Vec<&str> = channels.iter().filter(|(_, live)| **live).map(|(name, _)| *name).collect();
    let held = |name: &str| lines.iter().find(|l| l.channel == name).map_or(0, |l| l.allocation.held());
    Some(
        channels
            .iter()
            .map(|(name, attached)| ChannelReadiness {
                channel: (*name).to_owned(),
                allocated: item.opening_allocation(&live, name),
                stocked: held(name),
                agent_attached: *attached,
            })
            .collect(),
    )
}

/// The readiness of one item of the HTTP port's view (its sessions are every registered
/// channel's).
pub fn of_view(view: &LedgerView, ledger: &ItemLedger, now_ms: i64) -> Option<Vec<ChannelReadiness>> {
    let sessions = view.sessions.iter().map(|(name, session)| (name.as_str(), session));
    readiness(&ledger.item, &ledger.channels, sessions, now_ms)
}

/// A scheduled item's plan and countdown for the console's feed (`/api/items`), in the
/// center's clock.
#[derive(Debug, Serialize)]
pub struct ApiSchedule {
    /// 0: open from creation.
    pub opens_at_ms: i64,
    /// 0: no end.
    pub closes_at_ms: i64,
    pub prestock_lead_ms: u64,
    pub center_reserve: u64,
    /// `not_started`, `open` or `closed`.
    pub phase: &'static str,
    /// Until the opening, while not started.
    pub opens_in_ms: Option<i64>,
    /// Until the channels stock their pools, while that is ahead.
    pub stocking_in_ms: Option<i64>,
    /// Until the end, while open or not started with an end.
    pub closes_in_ms: Option<i64>,
    /// Each channel's readiness, while not started (empty afterwards).
    pub readiness: Vec<ChannelReadiness>,
}

/// The schedule of an item of the view (`None`: not scheduled).
pub fn api_schedule(view: &LedgerView, ledger: &ItemLedger, now_ms: i64) -> Option<ApiSchedule> {
    let item = &ledger.item;
    let s = item.plan.schedule;
    if !s.is_scheduled() {
        return None;
    }
    let phase = match phase(&s, now_ms) {
        _ if item.state.closed => "closed",
        Phase::Closed => "closed",
        Phase::NotStarted { .. } => "not_started",
        Phase::Open => "open",
    };
    let stocking_at = s.stocking_starts_at_ms();
    Some(ApiSchedule {
        opens_at_ms: s.opens_at_ms,
        closes_at_ms: s.closes_at_ms,
        prestock_lead_ms: s.prestock_lead_ms,
        center_reserve: item.plan.center_reserve,
        phase,
        opens_in_ms: (phase == "not_started").then(|| s.opens_at_ms - now_ms),
        stocking_in_ms: (phase == "not_started" && stocking_at > now_ms).then(|| stocking_at - now_ms),
        closes_in_ms: (phase != "closed" && s.closes_at_ms > 0).then(|| s.closes_at_ms - now_ms),
        readiness: of_view(view, ledger, now_ms).unwrap_or_default(),
    })
}

/// The schedule's families on `/metrics`. Samples only for items scheduled and not yet
/// opened (nor closed): an item's countdown and its channels' readiness disappear at the
/// opening, so the series stay as few as the items being planned times the channels.
pub(crate) fn encode_schedule(e: &mut DescriptorEncoder, view: Option<&LedgerView>, now_ms: i64) -> std::fmt::Result {
    let planned: Vec<(&ItemLedger, Vec<ChannelReadiness>)> =
        view.map_or_else(Vec::new, |v| v.items.iter().filter_map(|l| Some((l, of_view(v, l, now_ms)?))).collect());
    let gauge = MetricType::Gauge;
    let item = |l: &ItemLedger| [("item", l.item.item_id.clone())];
    let secs = |ms: i64| ms as f64 / 1000.0;
    family(
        e,
        "inventory_center_item_opens_in_seconds",
        "Seconds until the item opens, by the center's clock; only for items not yet opened (absent once open).",
        gauge,
        planned.iter().map(|(l, _)| (item(l), ConstGauge::new(secs(l.item.plan.schedule.opens_at_ms - now_ms)))),
    )?;
    family(
        e,
        "inventory_center_item_prestock_lead_seconds",
        "How long before its opening the channels stock the item; only for items not yet opened.",
        gauge,
        planned.iter().map(|(l, _)| {
            let lead = i64::try_from(l.item.plan.schedule.prestock_lead_ms).unwrap_or(i64::MAX);
            (item(l), ConstGauge::new(secs(lead)))
        }),
    )?;
    let lines = || {
        planned.iter().flat_map(|(l, r)| {
            r.iter().map(move |c| ([("item", l.item.item_id.clone()), ("channel", c.channel.clone())], c))
        })
    };
    family(
        e,
        "inventory_center_channel_allocated_units",
        "The channel's opening allocation of an item not yet opened: what it stocks at the start of the lead \
         (the total less the reserve, split over the channels whose lease is live now).",
        gauge,
        lines().map(|(labels, c)| (labels, ConstGauge::new(c.allocated))),
    )?;
    family(
        e,
        "inventory_center_channel_stocked_units",
        "Units the channel holds of an item not yet opened, toward its opening allocation.",
        gauge,
        lines().map(|(labels, c)| (labels, ConstGauge::new(c.stocked))),
    )
}

#[cfg(test)]
mod tests {
    use inventory_core::Quantity;
    use inventory_core::ledger::{Allocation, ItemState};
    use inventory_core::schedule::Schedule;
    use inventory_core::watermarks::Watermarks;

    use super::*;
    use crate::store::{LimitSettings, SalePlan};

    fn item(opens_at_ms: i64, closed: bool) -> ItemRecord {
        let mut state = ItemState::new(Quantity::parse("total", 1_000).expect("a quantity"), 1, 60_000);
        (state.available, state.closed) = (700, closed);
        ItemRecord {
            item_id: "launch".into(),
            state,
            watermarks: Watermarks { low: 1, high: 2, batch: 1 },
            rate_batching: None,
            segments: 1,
            limit: LimitSettings::default(),
            plan: SalePlan {
                schedule: Schedule { opens_at_ms, closes_at_ms: 0, prestock_lead_ms: 30_000 },
                center_reserve: 100,
            },
            shares: Default::default(),
            held: 300,
        }
    }

    fn session(lease_expires_at_ms: i64) -> ChannelSession {
        ChannelSession { epoch: 1, agent_id: "a".into(), lease_expires_at_ms, last_heartbeat_ms: 0 }
    }

    fn line(channel: &str, granted: u64, s: Option<ChannelSession>) -> ChannelRecord {
        ChannelRecord {
            channel: channel.into(),
            allocation: Allocation { granted, ..Allocation::default() },
            segments: Vec::new(),
            session: s,
            watermarks: Watermarks { low: 1, high: 2, batch: 1 },
            watermarks_overridden: false,
        }
    }

    #[test]
    fn live_channels_share_the_allocation_and_a_lapsed_one_is_shown_unattached() {
        let (live, gone) = (session(10_000), session(500));
        let sessions = [("app", &live), ("web", &live), ("partner", &gone)];
        let lines = [line("app", 450, Some(live.clone())), line("partner", 20, Some(gone.clone()))];
        let r = readiness(&item(60_000, false), &lines, sessions, 1_000).expect("before the opening");
        let view: Vec<_> = r.iter().map(|c| (c.channel.as_str(), c.allocated, c.stocked, c.agent_attached)).collect();
        // 900 over the two live channels; the lapsed one is allocated nothing but still holds.
        assert_eq!(view, [("app", 450, 450, true), ("partner", 0, 20, false), ("web", 450, 0, true)]);
    }

    #[test]
    fn nothing_is_shown_once_the_item_opened_or_closed_or_without_a_schedule() {
        let live = session(10_000);
        assert_eq!(readiness(&item(1_000, false), &[], [("app", &live)], 1_000), None);
        assert_eq!(readiness(&item(60_000, true), &[], [("app", &live)], 1_000), None);
        assert_eq!(readiness(&item(0, false), &[], [("app", &live)], 1_000), None);
    }
}
