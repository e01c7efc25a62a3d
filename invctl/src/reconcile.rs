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
    /// Also check the pools against the order consumer's PostgreSQL tables (as
    /// `order-sink` writes them): sold = confirmed orders, reserved = reserved orders, no
    /// event missing, each order in its reservation's latest state. Differences exit 1.
    #[arg(long, value_name = "URL")]
    orders_db: Option<String>,
    /// With --orders-db: CHANNEL=AGENT_URL (repeatable). That channel's pools are read
    /// from its agent (GetStock: the store's counters and the relay's published sequence,
    /// which must equal the last event the orders saw) instead of its last heartbeat.
    #[arg(long, value_name = "CHANNEL=URL", value_parser = channel_agent, requires = "orders_db")]
    agent_for: Vec<(String, String)>,
}

fn channel_agent(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((c, u)) if !c.is_empty() && !u.is_empty() => Ok((c.to_owned(), u.to_owned())),
        _ => Err(format!("{s:?} is not CHANNEL=AGENT_URL")),
    }
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
    /// With --orders-db: where the pools and the orders disagree.
    #[serde(skip_serializing_if = "Option::is_none")]
    order_differences: Option<Vec<crate::order_check::Difference>>,
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
        .reconcile(pb::ReconcileRequest { item_id: args.item.clone().unwrap_or_default() })
        .await?
        .into_inner();
    let order_differences = match &args.orders_db {
        Some(url) => Some(order_differences(ctx, &args, url).await?),
        None => None,
    };
    let orders_differ = order_differences.as_ref().is_some_and(|d| !d.is_empty());
    let view = ReconcileView {
        ok: r.ok,
        items_checked: r.items_checked,
        violations: r.violations.iter().map(Finding::from).collect(),
        drifts: r.drifts.iter().map(Finding::from).collect(),
        in_doubt: r.in_doubt.iter().map(Finding::from).collect(),
        order_differences: order_differences.clone(),
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
        match &order_differences {
            Some(d) if d.is_empty() => text.push_str("orders: the pools and the orders agree\n"),
            Some(d) => {
                text.push_str(&format!("ORDERS DIFFER ({} differences)\n", d.len()));
                let rows = d
                    .iter()
                    .map(|d| vec![d.item_id.clone(), d.channel.clone(), d.check.clone(), d.detail.clone()])
                    .collect();
                text.push_str(&table(&["ITEM", "CHANNEL", "CHECK", "DETAIL"], rows));
            }
            None => {}
        }
        text
    });
    Ok(if !r.ok || orders_differ {
        ExitCode::from(EXIT_VIOLATED)
    } else if !r.in_doubt.is_empty() {
        ExitCode::from(EXIT_IN_DOUBT)
    } else {
        ExitCode::SUCCESS
    })
}

/// The pools (the center's view, or the agent's for `--agent-for` channels) against the
/// orders tables.
async fn order_differences(
    ctx: &Ctx,
    args: &ReconcileArgs,
    url: &str,
) -> Result<Vec<crate::order_check::Difference>, Failure> {
    let mut admin = ctx.conn.admin(&ctx.center).await?;
    let items: Vec<String> = match &args.item {
        Some(item) => vec![item.clone()],
        None => {
            admin.list_items(pb::ListItemsRequest {}).await?.into_inner().items.into_iter().map(|i| i.item_id).collect()
        }
    };
    let mut agents = Vec::new();
    for (channel, agent_url) in &args.agent_for {
        agents.push((channel.clone(), ctx.conn.agent(agent_url).await?));
    }
    let mut pools = Vec::new();
    for item in items {
        let r = admin.get_item(pb::GetItemRequest { item_id: item.clone() }).await?.into_inner();
        for c in r.channels {
            let mut facts = crate::order_check::PoolFacts {
                channel: c.channel.clone(),
                item_id: item.clone(),
                generation: c.generation,
                reserved: c.reported_reserved,
                sold: c.reported_sold,
                published: None,
            };
            if let Some((_, agent)) = agents.iter_mut().find(|(ch, _)| *ch == c.channel) {
                let s = agent.get_stock(pb::GetStockRequest { item_id: item.clone() }).await?.into_inner();
                facts.generation = s.pool_generation;
                facts.reserved = s.reserved;
                facts.sold = s.sold;
                facts.published = Some(s.published_event_sequence);
            }
            pools.push(facts);
        }
    }
    let orders = crate::order_check::read(url).await.map_err(Failure)?;
    Ok(crate::order_check::compare(&pools, &orders))
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
