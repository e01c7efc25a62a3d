//! `invctl channel list|show|remove` and `invctl reclaim`.

use clap::{Args, Subcommand};
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::conn::Failure;
use crate::output::{SegmentView, fields, print, q, table};

#[derive(Subcommand)]
pub enum ChannelCmd {
    /// Every channel, one line each.
    List,
    /// One channel, per item.
    Show { channel: String },
    /// Forget a channel for good (a ghost, or one closed down): refused while it holds
    /// stock of any item or its agent is attached (live lease, not drained).
    Remove { channel: String },
}

#[derive(Args)]
pub struct ReclaimArgs {
    #[arg(long)]
    channel: String,
}

#[derive(Serialize)]
struct Reported {
    available: u64,
    reserved: u64,
    sold: u64,
}

#[derive(Serialize)]
struct ChannelItemView {
    item_id: String,
    held: u64,
    reported: Reported,
    drift: i64,
    in_doubt: u64,
    /// Units sold per second recently, as the channel last reported.
    sell_rate: f64,
    /// The batch its pool borrows now (0: it reports no rate; the fixed batch applies).
    batch: u64,
    /// A segmented pool's segments as last reported.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    segments: Vec<SegmentView>,
}

#[derive(Serialize)]
struct ChannelView {
    channel: String,
    agent_id: String,
    epoch: u64,
    lease_expires_at_unix_ms: i64,
    lease_live: bool,
    last_heartbeat_unix_ms: i64,
    items: Vec<ChannelItemView>,
}

impl From<&pb::ChannelInfo> for ChannelView {
    fn from(c: &pb::ChannelInfo) -> Self {
        Self {
            channel: c.channel.clone(),
            agent_id: c.agent_id.clone(),
            epoch: c.epoch,
            lease_expires_at_unix_ms: c.lease_expires_at_unix_ms,
            lease_live: c.lease_live,
            last_heartbeat_unix_ms: c.last_heartbeat_unix_ms,
            items: c
                .items
                .iter()
                .map(|i| ChannelItemView {
                    item_id: i.item_id.clone(),
                    held: i.held,
                    reported: Reported {
                        available: i.reported_available,
                        reserved: i.reported_reserved,
                        sold: i.reported_sold,
                    },
                    drift: i.drift,
                    in_doubt: i.in_doubt,
                    sell_rate: per_sec(i.sell_rate_milli),
                    batch: i.current_batch,
                    segments: i.segments.iter().map(SegmentView::from).collect(),
                })
                .collect(),
        }
    }
}

#[derive(Serialize)]
struct ReclaimedView {
    item_id: String,
    reclaimed: u64,
    in_doubt: u64,
}

#[derive(Serialize)]
struct ReclaimView {
    channel: String,
    new_epoch: u64,
    items: Vec<ReclaimedView>,
}

#[derive(Serialize)]
struct RemovedView {
    channel: String,
    last_epoch: u64,
    item_ids: Vec<String>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn lease(c: &pb::ChannelInfo, now: i64) -> String {
    if c.lease_live {
        format!("live ({} ms left)", c.lease_expires_at_unix_ms - now)
    } else {
        format!("expired {} ms ago", now - c.lease_expires_at_unix_ms)
    }
}

fn list_text(channels: &[pb::ChannelInfo], now: i64) -> String {
    let rows = channels
        .iter()
        .map(|c| {
            vec![
                c.channel.clone(),
                c.agent_id.clone(),
                c.epoch.to_string(),
                lease(c, now),
                format!("{} ms ago", now - c.last_heartbeat_unix_ms),
                c.items.len().to_string(),
                c.items.iter().map(|i| i.held).sum::<u64>().to_string(),
                c.items.iter().map(|i| i.drift).sum::<i64>().to_string(),
                c.items.iter().map(|i| i.in_doubt).sum::<u64>().to_string(),
            ]
        })
        .collect();
    table(&["CHANNEL", "AGENT", "EPOCH", "LEASE", "LAST HEARTBEAT", "ITEMS", "HELD", "DRIFT", "IN DOUBT"], rows)
}

fn show_text(channels: &[pb::ChannelInfo], now: i64) -> String {
    let mut text = String::new();
    for c in channels {
        text.push_str(&fields(&[
            ("channel", c.channel.clone()),
            ("agent", c.agent_id.clone()),
            ("epoch", c.epoch.to_string()),
            ("lease", lease(c, now)),
            ("last heartbeat", format!("{} ms ago", now - c.last_heartbeat_unix_ms)),
        ]));
        let mut rows = Vec::new();
        for i in &c.items {
            rows.push(vec![
                i.item_id.clone(),
                i.held.to_string(),
                i.reported_available.to_string(),
                i.reported_reserved.to_string(),
                i.reported_sold.to_string(),
                i.drift.to_string(),
                i.in_doubt.to_string(),
                format!("{:.1}", per_sec(i.sell_rate_milli)),
                if i.current_batch == 0 { "-".into() } else { i.current_batch.to_string() },
            ]);
            // A segmented pool: a row per segment under its sums.
            for g in i.segments.iter().map(SegmentView::from) {
                let mut row = vec![g.label(), String::new()];
                row.extend(g.counts());
                row.extend(std::iter::repeat_n(String::new(), 4));
                rows.push(row);
            }
        }
        text.push('\n');
        text.push_str(&table(
            &["ITEM", "HELD", "AVAILABLE", "RESERVED", "SOLD", "DRIFT", "IN DOUBT", "SELLS/S", "BATCH"],
            rows,
        ));
    }
    text
}

pub async fn run(ctx: &Ctx, cmd: ChannelCmd) -> Result<(), Failure> {
    match cmd {
        ChannelCmd::List => list(ctx, None).await,
        ChannelCmd::Show { channel } => list(ctx, Some(channel)).await,
        ChannelCmd::Remove { channel } => remove(ctx, channel).await,
    }
}

/// Every channel as a table (`None`), or one channel per item.
async fn list(ctx: &Ctx, one: Option<String>) -> Result<(), Failure> {
    let wanted = one.clone().unwrap_or_default();
    let r = ctx
        .conn
        .admin(&ctx.center)
        .await?
        .list_channels(pb::ListChannelsRequest { channel: wanted })
        .await?
        .into_inner();
    let now = now_ms();
    let view: Vec<ChannelView> = r.channels.iter().map(ChannelView::from).collect();
    print(ctx.output, &view, || match one {
        None => list_text(&r.channels, now),
        Some(_) => show_text(&r.channels, now),
    });
    Ok(())
}

async fn remove(ctx: &Ctx, channel: String) -> Result<(), Failure> {
    let r = ctx.conn.admin(&ctx.center).await?.remove_channel(pb::RemoveChannelRequest { channel }).await?.into_inner();
    let view = RemovedView { channel: r.channel, last_epoch: r.last_epoch, item_ids: r.item_ids };
    print(ctx.output, &view, || {
        let items = match view.item_ids.as_slice() {
            [] => "none".to_owned(),
            ids => ids.iter().map(|i| q(i)).collect::<Vec<_>>().join(", "),
        };
        format!("channel {} removed (last epoch {}; settled items: {items})\n", q(&view.channel), view.last_epoch)
    });
    Ok(())
}

pub async fn reclaim(ctx: &Ctx, args: ReclaimArgs) -> Result<(), Failure> {
    let channel = args.channel;
    let r =
        ctx.conn.admin(&ctx.center).await?.reclaim(pb::ReclaimRequest { channel: channel.clone() }).await?.into_inner();
    let view = ReclaimView {
        channel: channel.clone(),
        new_epoch: r.new_epoch,
        items: r
            .items
            .iter()
            .map(|i| ReclaimedView { item_id: i.item_id.clone(), reclaimed: i.reclaimed, in_doubt: i.in_doubt })
            .collect(),
    };
    print(ctx.output, &view, || {
        let rows =
            r.items.iter().map(|i| vec![i.item_id.clone(), i.reclaimed.to_string(), i.in_doubt.to_string()]).collect();
        format!(
            "channel {} fenced at epoch {}\n{}",
            q(&channel),
            r.new_epoch,
            table(&["ITEM", "RECLAIMED", "IN DOUBT"], rows)
        )
    });
    Ok(())
}

/// A reported rate (units/s × 1000) in units per second.
fn per_sec(milli: u64) -> f64 {
    #[allow(clippy::cast_precision_loss)] // rates far below 2^52
    let v = milli as f64 / 1000.0;
    v
}
