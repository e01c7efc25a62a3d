//! `invctl watermark set|get`, per item or per channel.

use clap::Subcommand;
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::count;
use crate::conn::Failure;
use crate::output::{print, q, table};

#[derive(Subcommand)]
pub enum WatermarkCmd {
    /// Set the item default, or a channel's override with --channel.
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
                })
                .await?
                .into_inner();
            let scope = if target.is_empty() { "default".to_owned() } else { format!("channel {}", q(&target)) };
            let text =
                format!("watermarks of {} ({scope}) set to low/high/batch {}\n", q(&item), wm_text(&r.watermarks));
            print(ctx.output, &SetView { item_id: item, channel: target, watermarks: wm_view(&r.watermarks) }, || text);
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
            };
            print(ctx.output, &view, || {
                let mut rows = vec![row("(default)".into(), &r.default_watermarks, None)];
                rows.extend(r.overrides.iter().map(|o| row(o.channel.clone(), &o.watermarks, None)));
                table(&["CHANNEL", "LOW", "HIGH", "BATCH"], rows)
            });
        }
    }
    Ok(())
}
