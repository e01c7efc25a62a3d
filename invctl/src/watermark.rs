//! `invctl watermark set|auto|get`: fixed watermarks per item or per channel, or an
//! item's rate-following batches.

use clap::Subcommand;
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::count;
use crate::conn::Failure;
use crate::output::{print, q, table};

#[derive(Subcommand)]
pub enum WatermarkCmd {
    /// Set fixed watermarks: the item default (rate-following off), or a channel's
    /// override with --channel.
    Set {
        item: String,
        #[arg(long)]
        channel: Option<String>,
        #[arg(long, value_parser = count, allow_negative_numbers = true)]
        low: u64,
        #[arg(long, value_parser = count, allow_negative_numbers = true)]
        high: u64,
        #[arg(long, value_parser = count, allow_negative_numbers = true)]
        batch: u64,
    },
    /// Make the item's batches follow each pool's sell rate: batch = rate x --target-ms
    /// within --min-batch..=--max-batch (0: defaults); --off returns to the fixed ones.
    Auto {
        item: String,
        #[arg(long, value_parser = count, allow_negative_numbers = true, default_value_t = 0)]
        min_batch: u64,
        #[arg(long, value_parser = count, allow_negative_numbers = true, default_value_t = 0)]
        max_batch: u64,
        #[arg(long, value_parser = count, allow_negative_numbers = true, default_value_t = 0)]
        target_ms: u64,
        #[arg(long)]
        off: bool,
    },
    /// The item default and every channel override; with --channel, the watermarks that
    /// channel's pool follows (its override, else the item default).
    Get {
        item: String,
        #[arg(long)]
        channel: Option<String>,
    },
}

#[derive(Serialize, Clone, Copy)]
pub struct WatermarksView {
    low: u64,
    high: u64,
    batch: u64,
}

impl From<&pb::Watermarks> for WatermarksView {
    fn from(w: &pb::Watermarks) -> Self {
        Self { low: w.low, high: w.high, batch: w.batch }
    }
}

pub fn wm_text(w: &Option<pb::Watermarks>) -> String {
    w.as_ref().map_or("-".into(), |w| format!("{}/{}/{}", w.low, w.high, w.batch))
}

fn wm_view(w: &Option<pb::Watermarks>) -> Option<WatermarksView> {
    w.as_ref().map(WatermarksView::from)
}

#[derive(Serialize)]
struct SetView {
    item_id: String,
    /// Empty: the item default.
    channel: String,
    watermarks: Option<WatermarksView>,
}

#[derive(Serialize)]
struct OverrideView {
    channel: String,
    watermarks: Option<WatermarksView>,
}

#[derive(Serialize)]
struct AllView {
    item_id: String,
    default: Option<WatermarksView>,
    overrides: Vec<OverrideView>,
    rate_batching: Option<RateView>,
}

/// An item's rate-following batches (`None` in JSON: fixed watermarks).
#[derive(Serialize)]
struct RateView {
    min_batch: u64,
    max_batch: u64,
    target_ms: u64,
}

fn rate_view(r: Option<&pb::RateBatching>) -> Option<RateView> {
    r.filter(|r| r.enabled).map(|r| RateView { min_batch: r.min_batch, max_batch: r.max_batch, target_ms: r.target_ms })
}

pub fn rate_text(r: Option<&pb::RateBatching>) -> String {
    rate_view(r).map_or("fixed".into(), |r| {
        format!("follows the sell rate: {} ms of sales, batch {}..={}", r.target_ms, r.min_batch, r.max_batch)
    })
}

#[derive(Serialize)]
struct AutoView {
    item_id: String,
    rate_batching: Option<RateView>,
    watermarks: Option<WatermarksView>,
}

#[derive(Serialize)]
struct ChannelView {
    item_id: String,
    channel: String,
    /// "channel" (its own override) or "default" (the item's).
    source: &'static str,
    watermarks: Option<WatermarksView>,
}

fn row(name: String, w: &Option<pb::Watermarks>, extra: Option<&str>) -> Vec<String> {
    let w = w.unwrap_or_default();
    let mut cells = vec![name, w.low.to_string(), w.high.to_string(), w.batch.to_string()];
    cells.extend(extra.map(str::to_owned));
    cells
}

pub async fn run(ctx: &Ctx, cmd: WatermarkCmd) -> Result<(), Failure> {
    let mut admin = ctx.conn.admin(&ctx.center).await?;
    match cmd {
        WatermarkCmd::Set { item, channel, low, high, batch } => {
            let target = channel.unwrap_or_default();
            let r = admin
                .set_watermarks(pb::SetWatermarksRequest {
                    item_id: item.clone(),
                    channel: target.clone(),
                    low,
                    high,
                    batch,
                    rate_batching: None,
                })
                .await?
                .into_inner();
            let scope = if target.is_empty() { "default".to_owned() } else { format!("channel {}", q(&target)) };
            let text =
                format!("watermarks of {} ({scope}) set to low/high/batch {}\n", q(&item), wm_text(&r.watermarks));
            print(ctx.output, &SetView { item_id: item, channel: target, watermarks: wm_view(&r.watermarks) }, || text);
        }
        WatermarkCmd::Auto { item, min_batch, max_batch, target_ms, off } => {
            let rate_batching = pb::RateBatching { enabled: !off, min_batch, max_batch, target_ms };
            let r = admin
                .set_watermarks(pb::SetWatermarksRequest {
                    item_id: item.clone(),
                    rate_batching: Some(rate_batching),
                    ..Default::default()
                })
                .await?
                .into_inner();
            let g = admin.get_watermarks(pb::GetWatermarksRequest { item_id: item.clone() }).await?.into_inner();
            let text = format!(
                "batches of {}: {} (fixed low/high/batch {})\n",
                q(&item),
                rate_text(g.rate_batching.as_ref()),
                wm_text(&r.watermarks)
            );
            let view = AutoView {
                item_id: item,
                rate_batching: rate_view(g.rate_batching.as_ref()),
                watermarks: wm_view(&r.watermarks),
            };
            print(ctx.output, &view, || text);
        }
        WatermarkCmd::Get { item, channel: Some(channel) } => {
            let r = admin.get_watermarks(pb::GetWatermarksRequest { item_id: item.clone() }).await?.into_inner();
            let own = r.overrides.iter().find(|o| o.channel == channel);
            let (source, from, w) = match own {
                Some(o) => ("channel", "channel override", &o.watermarks),
                None => ("default", "item default", &r.default_watermarks),
            };
            let view = ChannelView { item_id: item, channel: channel.clone(), source, watermarks: wm_view(w) };
            print(ctx.output, &view, || {
                table(&["CHANNEL", "LOW", "HIGH", "BATCH", "FROM"], vec![row(channel, w, Some(from))])
            });
        }
        WatermarkCmd::Get { item, channel: None } => {
            let r = admin.get_watermarks(pb::GetWatermarksRequest { item_id: item.clone() }).await?.into_inner();
            let view = AllView {
                item_id: item,
                default: wm_view(&r.default_watermarks),
                overrides: r
                    .overrides
                    .iter()
                    .map(|o| OverrideView { channel: o.channel.clone(), watermarks: wm_view(&o.watermarks) })
                    .collect(),
                rate_batching: rate_view(r.rate_batching.as_ref()),
            };
            print(ctx.output, &view, || {
                let mut rows = vec![row("(default)".into(), &r.default_watermarks, None)];
                rows.extend(r.overrides.iter().map(|o| row(o.channel.clone(), &o.watermarks, None)));
                let rate = rate_text(r.rate_batching.as_ref());
                format!(
                    "{}batches: {rate} (channel overrides stay fixed)\n",
                    table(&["CHANNEL", "LOW", "HIGH", "BATCH"], rows)
                )
            });
        }
    }
    Ok(())
}
