//! `invctl agent stock|acquire|confirm|cancel|basket`: an agent as a channel backend sees it.

use clap::{Args, Subcommand};
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::args::quantity;
use crate::conn::Failure;
use crate::output::{SegmentView, print, q, table};

#[derive(Subcommand)]
pub enum AgentCmd {
    /// The agent's pool of an item.
    Stock { item: String },
    /// Reserve units for a user (idempotent on --key).
    Acquire {
        item: String,
        #[arg(long)]
        user: String,
        #[arg(long, default_value_t = 1, value_parser = quantity, allow_negative_numbers = true)]
        quantity: u64,
        /// Idempotency key; defaults to a fresh one (printed, so a retry can reuse it).
        #[arg(long)]
        key: Option<String>,
        /// On a replay, the pool generation the first answer carried: refused
        /// (failed precondition) if the pool was lost and recreated since.
        #[arg(long, default_value_t = 0)]
        expect_pool_generation: u64,
        /// Reserve up to --quantity when fewer remain; the answer says how many.
        #[arg(long)]
        allow_partial: bool,
    },
    /// Confirm (pay) a reservation.
    Confirm(ReservationArgs),
    /// Cancel a reservation.
    Cancel(ReservationArgs),
    /// Baskets: several items for one user, all or none.
    #[command(subcommand)]
    Basket(crate::basket::BasketCmd),
}

#[derive(Args)]
pub struct ReservationArgs {
    item: String,
    /// The reservation id (or give it with --reservation).
    #[arg(value_name = "RESERVATION", required_unless_present = "reservation")]
    positional: Option<String>,
    /// The reservation id, as `acquire` printed it.
    #[arg(long, conflicts_with = "positional")]
    reservation: Option<String>,
}

impl ReservationArgs {
    fn id(self) -> (String, String) {
        let id = self.reservation.or(self.positional).unwrap_or_default();
        (self.item, id)
    }
}

#[derive(Serialize)]
struct StockView {
    item_id: String,
    available: u64,
    reserved: u64,
    sold: u64,
    sold_out: bool,
    /// A segmented item's segments (the fields above are their sums).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    segments: Vec<SegmentView>,
}

#[derive(Serialize)]
struct AcquireView {
    item_id: String,
    user_id: String,
    idempotency_key: String,
    outcome: &'static str,
    reservation_id: String,
    quantity: u64,
    expires_at_unix_ms: i64,
    replayed: bool,
    pool_generation: u64,
    /// With limit_exceeded: how many more units the user may still take.
    limit_remaining: u64,
}

#[derive(Serialize)]
struct StateView {
    reservation_id: String,
    state: &'static str,
}

pub(crate) fn outcome_text(o: pb::AcquireOutcome) -> &'static str {
    match o {
        pb::AcquireOutcome::Reserved => "reserved",
        pb::AcquireOutcome::SoldOut => "sold_out",
        pb::AcquireOutcome::LimitExceeded => "limit_exceeded",
        pb::AcquireOutcome::NotStarted => "not_started",
        pb::AcquireOutcome::Unspecified => "unspecified",
    }
}

pub(crate) fn state_text(s: pb::ReservationState) -> &'static str {
    match s {
        pb::ReservationState::Reserved => "reserved",
        pb::ReservationState::Confirmed => "confirmed",
        pb::ReservationState::Cancelled => "cancelled",
        pb::ReservationState::Expired => "expired",
        pb::ReservationState::Refunded => "refunded",
        pb::ReservationState::Unspecified => "unspecified",
    }
}

pub async fn run(ctx: &Ctx, cmd: AgentCmd) -> Result<(), Failure> {
    let mut client = ctx.conn.agent(&ctx.agent).await?;
    match cmd {
        AgentCmd::Stock { item } => {
            let r = client.get_stock(pb::GetStockRequest { item_id: item.clone() }).await?.into_inner();
            let view = StockView {
                item_id: item,
                available: r.available,
                reserved: r.reserved,
                sold: r.sold,
                sold_out: r.sold_out,
                segments: r.segments.iter().map(SegmentView::from).collect(),
            };
            print(ctx.output, &view, || {
                let mut rows = vec![vec![
                    view.item_id.clone(),
                    r.available.to_string(),
                    r.reserved.to_string(),
                    r.sold.to_string(),
                    r.sold_out.to_string(),
                ]];
                // One row per segment under the sums.
                for g in &view.segments {
                    let mut row = vec![g.label()];
                    row.extend(g.counts());
                    row.push(String::new());
                    rows.push(row);
                }
                table(&["ITEM", "AVAILABLE", "RESERVED", "SOLD", "SOLD_OUT"], rows)
            });
        }
        AgentCmd::Acquire { item, user, quantity, key, expect_pool_generation, allow_partial } => {
            let key = key.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let r = client
                .acquire(pb::AcquireRequest {
                    item_id: item.clone(),
                    user_id: user.clone(),
                    quantity,
                    idempotency_key: key.clone(),
                    expect_pool_generation,
                    allow_partial,
                })
                .await?
                .into_inner();
            let outcome = outcome_text(r.outcome());
            let text = match r.outcome() {
                pb::AcquireOutcome::Reserved => format!(
                    "reserved {}{} of {} for {}: reservation {} (key {}{})\n",
                    r.quantity,
                    if r.quantity < quantity { format!(" (of {quantity} asked)") } else { String::new() },
                    q(&item),
                    q(&user),
                    q(&r.reservation_id),
                    q(&key),
                    if r.replayed { ", replayed" } else { "" }
                ),
                pb::AcquireOutcome::LimitExceeded => format!(
                    "{outcome}: {} for {} (key {}): {} may take {} more\n",
                    q(&item),
                    q(&user),
                    q(&key),
                    q(&user),
                    r.limit_remaining
                ),
                _ => format!("{outcome}: {} for {} (key {})\n", q(&item), q(&user), q(&key)),
            };
            let view = AcquireView {
                item_id: item,
                user_id: user,
                idempotency_key: key,
                outcome,
                reservation_id: r.reservation_id,
                quantity: r.quantity,
                expires_at_unix_ms: r.expires_at_unix_ms,
                replayed: r.replayed,
                pool_generation: r.pool_generation,
                limit_remaining: r.limit_remaining,
            };
            print(ctx.output, &view, || text);
        }
        AgentCmd::Confirm(args) => {
            let (item_id, reservation_id) = args.id();
            let r = client
                .confirm(pb::ConfirmRequest { item_id, reservation_id: reservation_id.clone() })
                .await?
                .into_inner();
            state_reply(ctx, reservation_id, state_text(r.state()));
        }
        AgentCmd::Basket(cmd) => crate::basket::run(ctx, &mut client, cmd).await?,
        AgentCmd::Cancel(args) => {
            let (item_id, reservation_id) = args.id();
            let r = client
                .cancel(pb::CancelRequest { item_id, reservation_id: reservation_id.clone() })
                .await?
                .into_inner();
            state_reply(ctx, reservation_id, state_text(r.state()));
        }
    }
    Ok(())
}

pub(crate) fn state_reply(ctx: &Ctx, reservation_id: String, state: &'static str) {
    let text = format!("reservation {}: {state}\n", q(&reservation_id));
    print(ctx.output, &StateView { reservation_id, state }, || text);
}
