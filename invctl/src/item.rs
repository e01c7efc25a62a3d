//! `invctl item create|show|list|close|add-stock`.

use clap::Subcommand;
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::{count, quantity, share};
use crate::conn::Failure;
use crate::output::{fields, print, q, table};
use crate::watermark::{WatermarksView, wm_text};
use crate::when::{self, When};

#[derive(Subcommand)]
pub enum ItemCmd {
    /// Create an item (idempotent for the same definition).
    Create {
        item: String,
        #[arg(long, value_parser = count, allow_negative_numbers = true)]
        total: u64,
        /// Units one user may hold (per channel, or over all channels with --limit-scope global).
        #[arg(long, default_value_t = 1, value_parser = count, allow_negative_numbers = true)]
        per_user_limit: u64,
        /// Where --per-user-limit applies: in each channel, or over all channels (agents
        /// then need --buyer-registry-url).
        #[arg(long, value_enum, default_value_t = Scope::Channel)]
        limit_scope: Scope,
        /// For a global limit, when the buyer registry is unreachable: refuse (UNAVAILABLE)
        /// or sell under the per-channel limit only.
        #[arg(long, value_enum, default_value_t = Fallback::Refuse)]
        registry_fallback: Fallback,
        /// Reservation lifetime before it expires.
        #[arg(long, default_value_t = 300_000, value_parser = count, allow_negative_numbers = true)]
        reservation_ttl_ms: u64,
        /// Default watermarks (all three, or none for defaults derived from --total).
        #[arg(long, requires_all = ["high", "batch"], value_parser = count, allow_negative_numbers = true)]
        low: Option<u64>,
        #[arg(long, requires_all = ["low", "batch"], value_parser = count, allow_negative_numbers = true)]
        high: Option<u64>,
        #[arg(long, requires_all = ["low", "high"], value_parser = count, allow_negative_numbers = true)]
        batch: Option<u64>,
        /// Pool segments per channel: a hot item's pool split over as many Redis hash tags,
        /// the user id picking one. The center accepts only 1 until agents sell from
        /// segmented pools.
        #[arg(long, default_value_t = 1)]
        segments: u32,
        /// When the sale opens: RFC 3339, relative to this machine's clock (+30s, +2h), or
        /// now (the default). Before it agents answer NOT_STARTED.
        #[arg(long, value_parser = when::when, allow_hyphen_values = true)]
        opens_at: Option<When>,
        /// When the sale closes by itself (unsold units return to the center): RFC 3339,
        /// +1h, or none (the default).
        #[arg(long, value_parser = when::when, allow_hyphen_values = true)]
        closes_at: Option<When>,
        /// How long before the opening the channels stock their pools (30s, 2m; default 30s,
        /// at most a day).
        #[arg(long, value_parser = when::duration)]
        prestock_lead: Option<u64>,
        /// Units the center keeps back from the opening stock (default 5 % of --total).
        #[arg(long, value_parser = count, allow_negative_numbers = true)]
        reserve: Option<u64>,
        /// A channel's part of the plan, repeated per channel: CHANNEL=WEIGHT, optionally
        /// :cap=N (it never holds more) and :floor=N (kept for it while it sells), e.g.
        /// --share app=50 --share partner=20:cap=300:floor=100. None: an even split, no caps.
        #[arg(long = "share", value_parser = share, allow_hyphen_values = true)]
        shares: Vec<pb::ChannelShare>,
    },
    /// Move an item's schedule: both times before the opening, only --closes-at after it.
    /// A time not given stays as it is; relative times count from the center's clock.
    Schedule {
        item: String,
        #[arg(long, value_parser = when::when, allow_hyphen_values = true)]
        opens_at: Option<When>,
        #[arg(long, value_parser = when::when, allow_hyphen_values = true)]
        closes_at: Option<When>,
    },
    /// The ledger view of one item, per channel.
    Show { item: String },
    /// Every item.
    List,
    /// Stop granting the item to channels (pools sell out, then SOLD_OUT); --reopen undoes.
    Close {
        item: String,
        #[arg(long)]
        reopen: bool,
    },
    /// Add units; repeat with the same --request-id to retry safely.
    AddStock {
        item: String,
        #[arg(long, value_parser = quantity, allow_negative_numbers = true)]
        quantity: u64,
        /// Defaults to a fresh id (printed, so a retry can reuse it).
        #[arg(long)]
        request_id: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scope {
    Channel,
    Global,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fallback {
    Refuse,
    Channel,
}

fn scope_text(s: i32) -> &'static str {
    match pb::LimitScope::try_from(s) {
        Ok(pb::LimitScope::Channel) => "channel",
        Ok(pb::LimitScope::Global) => "global",
        Err(_) => "unknown",
    }
}

fn fallback_text(f: i32) -> &'static str {
    match pb::RegistryFallback::try_from(f) {
        Ok(pb::RegistryFallback::Refuse) => "refuse",
        Ok(pb::RegistryFallback::Channel) => "channel",
        Err(_) => "unknown",
    }
}

#[derive(Serialize)]
pub struct ItemView {
    item_id: String,
    total: u64,
    available: u64,
    held: u64,
    per_user_limit: u64,
    limit_scope: &'static str,
    registry_fallback: &'static str,
    reservation_ttl_ms: u64,
    closed: bool,
    watermarks: Option<WatermarksView>,
    segments: u32,
    /// The schedule (0: open from creation; 0: no end), ms since 1970 by the center's clock.
    opens_at_unix_ms: i64,
    closes_at_unix_ms: i64,
    prestock_lead_ms: u64,
    center_reserve: u64,
    /// The plan per channel (cap 0: none), by channel.
    channel_shares: Vec<ShareView>,
}

#[derive(Serialize)]
struct ShareView {
    channel: String,
    weight: u64,
    cap_units: u64,
    floor_units: u64,
}

/// `app 50, partner 20 (cap 300, floor 100)`, or how the stock is split without shares.
fn shares_text(i: &pb::Item) -> String {
    if i.channel_shares.is_empty() {
        return "none: an even split over the channels selling, no caps".into();
    }
    let one = |s: &pb::ChannelShare| {
        let mut limits = Vec::new();
        if s.cap_units > 0 {
            limits.push(format!("cap {}", s.cap_units));
        }
        if s.floor_units > 0 {
            limits.push(format!("floor {}", s.floor_units));
        }
        let limits = if limits.is_empty() { String::new() } else { format!(" ({})", limits.join(", ")) };
        format!("{} {}{limits}", s.channel, s.weight)
    };
    i.channel_shares.iter().map(one).collect::<Vec<_>>().join(", ")
}

impl From<&pb::Item> for ItemView {
    fn from(i: &pb::Item) -> Self {
        Self {
            item_id: i.item_id.clone(),
            total: i.total,
            available: i.available,
            held: i.held,
            per_user_limit: i.per_user_limit,
            limit_scope: scope_text(i.limit_scope),
            registry_fallback: fallback_text(i.registry_fallback),
            reservation_ttl_ms: i.reservation_ttl_ms,
            closed: i.closed,
            watermarks: i.watermarks.as_ref().map(WatermarksView::from),
            segments: i.segments.max(1),
            opens_at_unix_ms: i.opens_at_unix_ms,
            closes_at_unix_ms: i.closes_at_unix_ms,
            prestock_lead_ms: i.prestock_lead_ms,
            center_reserve: i.center_reserve,
            channel_shares: i
                .channel_shares
                .iter()
                .map(|s| ShareView {
                    channel: s.channel.clone(),
                    weight: s.weight,
                    cap_units: s.cap_units,
                    floor_units: s.floor_units,
                })
                .collect(),
        }
    }
}

/// Where a sale stands at the center's `now_ms`, and how long until its next step.
#[derive(Serialize)]
struct Countdown {
    /// `not_started`, `open` or `closed`.
    phase: &'static str,
    /// Until the opening (while not started).
    opens_in_ms: Option<i64>,
    /// Until the channels stock their pools (while that is ahead).
    stocking_in_ms: Option<i64>,
    /// Until the end (while open with an end).
    closes_in_ms: Option<i64>,
    center_now_unix_ms: i64,
}

fn countdown(i: &pb::Item, now_ms: i64) -> Countdown {
    let (opens, closes) = (i.opens_at_unix_ms, i.closes_at_unix_ms);
    let lead = i64::try_from(i.prestock_lead_ms).unwrap_or(i64::MAX);
    let phase = if i.closed || (closes > 0 && now_ms >= closes) {
        "closed"
    } else if opens > now_ms {
        "not_started"
    } else {
        "open"
    };
    Countdown {
        phase,
        opens_in_ms: (phase == "not_started").then(|| opens - now_ms),
        stocking_in_ms: (phase == "not_started" && opens.saturating_sub(lead) > now_ms)
            .then(|| opens.saturating_sub(lead) - now_ms),
        closes_in_ms: (phase != "closed" && closes > 0).then(|| closes - now_ms),
        center_now_unix_ms: now_ms,
    }
}

fn schedule_text(i: &pb::Item, c: &Countdown) -> Vec<(&'static str, String)> {
    let opens = match (i.opens_at_unix_ms, c.opens_in_ms) {
        (0, _) => "at creation".to_owned(),
        (t, Some(left)) => format!("{} (in {})", when::show(t), when::span(left)),
        (t, None) => when::show(t),
    };
    let closes = match (i.closes_at_unix_ms, c.closes_in_ms) {
        (0, _) => "no end".to_owned(),
        (t, Some(left)) => format!("{} (in {})", when::show(t), when::span(left)),
        (t, None) => when::show(t),
    };
    let lead = match c.stocking_in_ms {
        Some(left) => format!(
            "{} before the opening (in {})",
            when::span(i64::try_from(i.prestock_lead_ms).unwrap_or(0)),
            when::span(left)
        ),
        None => format!("{} before the opening", when::span(i64::try_from(i.prestock_lead_ms).unwrap_or(0))),
    };
    vec![
        ("sale", c.phase.replace('_', " ")),
        ("opens", opens),
        ("closes", closes),
        ("stocking", lead),
        ("center reserve", i.center_reserve.to_string()),
        ("shares", shares_text(i)),
    ]
}

#[derive(Serialize)]
struct Scheduled {
    #[serde(flatten)]
    item: ItemView,
    #[serde(flatten)]
    countdown: Countdown,
}

#[derive(Serialize)]
struct Created {
    #[serde(flatten)]
    item: ItemView,
    created: bool,
}

#[derive(Serialize)]
struct StockAdded {
    #[serde(flatten)]
    item: ItemView,
    request_id: String,
    replayed: bool,
}

#[derive(Serialize)]
struct Reported {
    available: u64,
    reserved: u64,
    sold: u64,
    at_unix_ms: i64,
}

#[derive(Serialize)]
struct AllocationView {
    channel: String,
    held: u64,
    granted: u64,
    returned: u64,
    reclaimed: u64,
    reported: Reported,
    drift: i64,
    in_doubt: u64,
    generation: u64,
    epoch: u64,
    lease_expires_at_unix_ms: i64,
    lease_live: bool,
    watermarks: Option<WatermarksView>,
}

impl From<&pb::ChannelAllocation> for AllocationView {
    fn from(c: &pb::ChannelAllocation) -> Self {
        Self {
            channel: c.channel.clone(),
            held: c.held,
            granted: c.granted,
            returned: c.returned,
            reclaimed: c.reclaimed,
            reported: Reported {
                available: c.reported_available,
                reserved: c.reported_reserved,
                sold: c.reported_sold,
                at_unix_ms: c.reported_at_unix_ms,
            },
            drift: c.drift,
            in_doubt: c.in_doubt,
            generation: c.generation,
            epoch: c.epoch,
            lease_expires_at_unix_ms: c.lease_expires_at_unix_ms,
            lease_live: c.lease_live,
            watermarks: c.watermarks.as_ref().map(WatermarksView::from),
        }
    }
}

#[derive(Serialize)]
struct ItemDetail {
    #[serde(flatten)]
    item: ItemView,
    #[serde(flatten)]
    countdown: Countdown,
    channels: Vec<AllocationView>,
    /// Before a scheduled item's opening: each channel's readiness (empty otherwise).
    readiness: Vec<ReadinessView>,
}

/// One channel's readiness for the opening, as the center computed it.
#[derive(Serialize)]
struct ReadinessView {
    channel: String,
    /// Its opening allocation, as the center would answer it now.
    allocated: u64,
    /// What it holds of the item.
    stocked: u64,
    /// Its lease is live.
    agent_attached: bool,
    /// Attached and stocked to its allocation.
    ready: bool,
}

impl From<&pb::ChannelReadiness> for ReadinessView {
    fn from(r: &pb::ChannelReadiness) -> Self {
        Self {
            channel: r.channel.clone(),
            allocated: r.allocated,
            stocked: r.stocked,
            agent_attached: r.agent_attached,
            ready: r.agent_attached && r.stocked >= r.allocated,
        }
    }
}

/// `in_lead`: the channels' stocking time has come, so a channel short of its allocation
/// is late rather than waiting for it.
fn readiness_text(readiness: &[ReadinessView], in_lead: bool) -> String {
    let rows = readiness
        .iter()
        .map(|r| {
            let state = match (r.agent_attached, r.ready) {
                (false, _) => "no agent attached".to_owned(),
                (true, true) => "ready".to_owned(),
                (true, false) if in_lead => format!("short by {}", r.allocated - r.stocked),
                (true, false) => format!("stocks {} at the lead", r.allocated - r.stocked),
            };
            let agent = if r.agent_attached { "attached" } else { "-" };
            vec![r.channel.clone(), r.allocated.to_string(), r.stocked.to_string(), agent.into(), state]
        })
        .collect();
    table(&["CHANNEL", "ALLOCATED", "STOCKED", "AGENT", "READINESS"], rows)
}

pub fn items_table(items: &[pb::Item]) -> String {
    let rows = items
        .iter()
        .map(|i| {
            vec![
                i.item_id.clone(),
                i.total.to_string(),
                i.available.to_string(),
                i.held.to_string(),
                i.per_user_limit.to_string(),
                i.reservation_ttl_ms.to_string(),
                wm_text(&i.watermarks),
            ]
        })
        .collect();
    table(&["ITEM", "TOTAL", "AVAILABLE", "HELD", "LIMIT", "TTL_MS", "LOW/HIGH/BATCH"], rows)
}

fn lease_text(c: &pb::ChannelAllocation) -> &'static str {
    if c.epoch == 0 {
        "-"
    } else if c.lease_live {
        "live"
    } else {
        "expired"
    }
}

fn limit_text(i: &pb::Item) -> String {
    if i.limit_scope == i32::from(pb::LimitScope::Global) {
        let fallback = fallback_text(i.registry_fallback);
        format!("{} over all channels (registry down: {fallback})", i.per_user_limit)
    } else {
        format!("{} per channel", i.per_user_limit)
    }
}

fn detail_text(i: &pb::Item, channels: &[pb::ChannelAllocation], c: &Countdown) -> String {
    let mut rows = vec![
        ("item", i.item_id.clone()),
        ("total", i.total.to_string()),
        ("center available", i.available.to_string()),
        ("held by channels", i.held.to_string()),
        ("per-user limit", limit_text(i)),
        ("reservation ttl", format!("{} ms", i.reservation_ttl_ms)),
        ("watermarks", wm_text(&i.watermarks)),
        ("segments", i.segments.max(1).to_string()),
        ("state", if i.closed { "closed".into() } else { "open".into() }),
    ];
    rows.extend(schedule_text(i, c));
    let mut text = fields(&rows);
    if !channels.is_empty() {
        let rows = channels
            .iter()
            .map(|c| {
                vec![
                    c.channel.clone(),
                    c.held.to_string(),
                    c.granted.to_string(),
                    c.returned.to_string(),
                    c.reclaimed.to_string(),
                    c.reported_available.to_string(),
                    c.reported_reserved.to_string(),
                    c.reported_sold.to_string(),
                    c.drift.to_string(),
                    c.in_doubt.to_string(),
                    c.generation.to_string(),
                    c.epoch.to_string(),
                    lease_text(c).into(),
                    wm_text(&c.watermarks),
                ]
            })
            .collect();
        text.push('\n');
        text.push_str(&table(
            &[
                "CHANNEL",
                "HELD",
                "GRANTED",
                "RETURNED",
                "RECLAIMED",
                "AVAILABLE",
                "RESERVED",
                "SOLD",
                "DRIFT",
                "IN DOUBT",
                "GENERATION",
                "EPOCH",
                "LEASE",
                "LOW/HIGH/BATCH",
            ],
            rows,
        ));
    }
    text
}

/// This machine's clock, for relative times at creation (the item's countdowns use the
/// center's).
fn local_now_ms() -> i64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

pub async fn run(ctx: &Ctx, cmd: ItemCmd) -> Result<(), Failure> {
    let mut admin = ctx.conn.admin(&ctx.center).await?;
    match cmd {
        ItemCmd::Create {
            item,
            total,
            per_user_limit,
            limit_scope,
            registry_fallback,
            reservation_ttl_ms,
            low,
            high,
            batch,
            segments,
            opens_at,
            closes_at,
            prestock_lead,
            reserve,
            shares,
        } => {
            let now = local_now_ms();
            let watermarks = match (low, high, batch) {
                (Some(low), Some(high), Some(batch)) => Some(pb::Watermarks { low, high, batch }),
                _ => None,
            };
            let r = admin
                .create_item(pb::CreateItemRequest {
                    item_id: item,
                    total,
                    per_user_limit,
                    reservation_ttl_ms,
                    watermarks,
                    // Absent: rate-following, unless fixed watermarks were given.
                    rate_batching: None,
                    segments,
                    limit_scope: match limit_scope {
                        Scope::Channel => pb::LimitScope::Channel,
                        Scope::Global => pb::LimitScope::Global,
                    }
                    .into(),
                    registry_fallback: match registry_fallback {
                        Fallback::Refuse => pb::RegistryFallback::Refuse,
                        Fallback::Channel => pb::RegistryFallback::Channel,
                    }
                    .into(),
                    opens_at_unix_ms: opens_at.map_or(0, |w| w.resolve(now)),
                    closes_at_unix_ms: closes_at.map_or(0, |w| w.resolve(now)),
                    prestock_lead_ms: prestock_lead.unwrap_or(0),
                    center_reserve: reserve,
                    channel_shares: shares,
                })
                .await?
                .into_inner();
            let i = r.item.unwrap_or_default();
            print(ctx.output, &Created { item: ItemView::from(&i), created: r.created }, || {
                let verb = if r.created { "created" } else { "already exists (same definition)" };
                format!("item {} {verb}\n{}", q(&i.item_id), items_table(std::slice::from_ref(&i)))
            });
        }
        ItemCmd::Show { item } => {
            let r = admin.get_item(pb::GetItemRequest { item_id: item }).await?.into_inner();
            let i = r.item.unwrap_or_default();
            let view = ItemDetail {
                item: ItemView::from(&i),
                countdown: countdown(&i, r.center_now_unix_ms),
                channels: r.channels.iter().map(AllocationView::from).collect(),
                readiness: r.readiness.iter().map(ReadinessView::from).collect(),
            };
            print(ctx.output, &view, || {
                let mut text = detail_text(&i, &r.channels, &view.countdown);
                if !view.readiness.is_empty() {
                    text.push_str("\nreadiness for the opening\n");
                    text.push_str(&readiness_text(&view.readiness, view.countdown.stocking_in_ms.is_none()));
                }
                text
            });
        }
        ItemCmd::Schedule { item, opens_at, closes_at } => {
            // Times not given stay as they are; relative ones count from the center's clock.
            let r = admin.get_item(pb::GetItemRequest { item_id: item.clone() }).await?.into_inner();
            let (current, now) = (r.item.unwrap_or_default(), r.center_now_unix_ms);
            let r = admin
                .set_schedule(pb::SetScheduleRequest {
                    item_id: item,
                    opens_at_unix_ms: opens_at.map_or(current.opens_at_unix_ms, |w| w.resolve(now)),
                    closes_at_unix_ms: closes_at.map_or(current.closes_at_unix_ms, |w| w.resolve(now)),
                })
                .await?
                .into_inner();
            let i = r.item.unwrap_or_default();
            let view = Scheduled { item: ItemView::from(&i), countdown: countdown(&i, r.center_now_unix_ms) };
            print(ctx.output, &view, || {
                format!("item {} scheduled\n{}", q(&i.item_id), fields(&schedule_text(&i, &view.countdown)))
            });
        }
        ItemCmd::List => {
            let r = admin.list_items(pb::ListItemsRequest {}).await?.into_inner();
            let view: Vec<ItemView> = r.items.iter().map(ItemView::from).collect();
            print(ctx.output, &view, || items_table(&r.items));
        }
        ItemCmd::Close { item, reopen } => {
            let r =
                admin.close_item(pb::CloseItemRequest { item_id: item.clone(), closed: !reopen }).await?.into_inner();
            let i = r.item.unwrap_or_default();
            print(ctx.output, &ItemView::from(&i), || {
                format!("item {} {}\n", q(&item), if i.closed { "closed: no more grants" } else { "open" })
            });
        }
        ItemCmd::AddStock { item, quantity, request_id } => {
            let request_id = request_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let r = admin
                .add_stock(pb::AddStockRequest { item_id: item, quantity, request_id: request_id.clone() })
                .await?
                .into_inner();
            let i = r.item.unwrap_or_default();
            let view = StockAdded { item: ItemView::from(&i), request_id: request_id.clone(), replayed: r.replayed };
            print(ctx.output, &view, || {
                let note = if r.replayed { " (replay: already applied)" } else { "" };
                format!(
                    "added {quantity} to {} (request id {}){note}\n{}",
                    q(&i.item_id),
                    q(&request_id),
                    items_table(std::slice::from_ref(&i))
                )
            });
        }
    }
    Ok(())
}
