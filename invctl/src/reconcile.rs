//! `invctl reconcile` (exit 0 all well, 1 an invariant violated, 3 units in doubt) and
//! `invctl resolve`.

use std::process::ExitCode;

use clap::Args;
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::count;
use crate::conn::Failure;
use crate::item::ItemView;
use crate::output::{print, q, table};

/// Exit code of `reconcile` when an invariant is violated.
pub const EXIT_VIOLATED: u8 = 1;
/// Exit code of `reconcile` while units are in doubt (and nothing is violated): the
/// ledger is sound but an operator must settle them with `invctl resolve`.
pub const EXIT_IN_DOUBT: u8 = 3;

#[derive(Args)]
pub struct ReconcileArgs {
    /// Check only this item.
    #[arg(long)]
    item: Option<String>,
}

#[derive(Args)]
pub struct ResolveArgs {
    #[arg(long)]
    item: String,
    #[arg(long)]
    channel: String,
    /// Units the channel's orders show as sold.
    #[arg(long, value_parser = count, allow_negative_numbers = true)]
    sold: u64,
}

#[derive(Serialize)]
struct Finding {
    item_id: String,
    channel: String,
    invariant: String,
    detail: String,
}

impl From<&pb::Violation> for Finding {
    fn from(v: &pb::Violation) -> Self {
        Self {
            item_id: v.item_id.clone(),
            channel: v.channel.clone(),
            invariant: v.invariant.clone(),
            detail: v.detail.clone(),
        }
    }
}

#[derive(Serialize)]
struct ReconcileView {
    ok: bool,
    items_checked: u64,
    violations: Vec<Finding>,
    drifts: Vec<Finding>,
    in_doubt: Vec<Finding>,
}

#[derive(Serialize)]
struct ResolveView {
    item_id: String,
    channel: String,
    written_off: u64,
    returned_to_center: u64,
    item: Option<ItemView>,
}

pub async fn reconcile(ctx: &Ctx, args: ReconcileArgs) -> Result<ExitCode, Failure> {
    let r = ctx
        .conn
        .admin(&ctx.center)
        .await?
        .reconcile(pb::ReconcileRequest { item_id: args.item.unwrap_or_default() })
        .await?
        .into_inner();
    let view = ReconcileView {
        ok: r.ok,
        items_checked: r.items_checked,
        violations: r.violations.iter().map(Finding::from).collect(),
        drifts: r.drifts.iter().map(Finding::from).collect(),
        in_doubt: r.in_doubt.iter().map(Finding::from).collect(),
    };
    print(ctx.output, &view, || {
        let verdict = if !r.ok {
            "VIOLATED"
        } else if !r.in_doubt.is_empty() {
            "IN DOUBT: no invariant violated, but units wait for `invctl resolve`"
        } else {
            "ok: no invariant violated"
        };
        let mut text = format!("{verdict} ({} items checked)\n", r.items_checked);
        let rows: Vec<Vec<String>> = r
            .violations
            .iter()
            .map(|v| ("violation", v))
            .chain(r.drifts.iter().map(|v| ("drift", v)))
            .chain(r.in_doubt.iter().map(|v| ("in doubt", v)))
            .map(|(kind, v)| {
                vec![kind.into(), v.item_id.clone(), v.channel.clone(), v.invariant.clone(), v.detail.clone()]
            })
            .collect();
        if !rows.is_empty() {
            text.push_str(&table(&["KIND", "ITEM", "CHANNEL", "RULE", "DETAIL"], rows));
        }
        text
    });
    Ok(if !r.ok {
        ExitCode::from(EXIT_VIOLATED)
    } else if !r.in_doubt.is_empty() {
        ExitCode::from(EXIT_IN_DOUBT)
    } else {
        ExitCode::SUCCESS
    })
}

pub async fn resolve(ctx: &Ctx, args: ResolveArgs) -> Result<(), Failure> {
    let ResolveArgs { item, channel, sold } = args;
    let r = ctx
        .conn
        .admin(&ctx.center)
        .await?
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: item.clone(), channel: channel.clone(), sold })
        .await?
        .into_inner();
    let text = format!(
        "{} in channel {}: {} written off as sold, {} back at the center\n",
        q(&item),
        q(&channel),
        r.written_off,
        r.returned_to_center
    );
    let view = ResolveView {
        item_id: item,
        channel,
        written_off: r.written_off,
        returned_to_center: r.returned_to_center,
        item: r.item.as_ref().map(ItemView::from),
    };
    print(ctx.output, &view, || text);
    Ok(())
}
