//! `invctl agent basket acquire|confirm|cancel`: several items for one user, all or none.

use clap::Subcommand;
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::agent::{outcome_text, state_text};
use crate::args::quantity;
use crate::conn::{Authed, Failure};
use crate::output::{print, q, table};
use inventory_proto::v1::agent_client::AgentClient;

#[derive(Subcommand)]
pub enum BasketCmd {
    /// Reserve every line for a user, or none (idempotent on --key).
    Acquire {
        /// Lines as ITEM or ITEM=QUANTITY (1 by default); lines of one item are summed.
        #[arg(required = true, value_name = "ITEM[=QUANTITY]", value_parser = line)]
        lines: Vec<(String, u64)>,
        #[arg(long)]
        user: String,
        /// Idempotency key; defaults to a fresh one (printed, so a retry can reuse it).
        #[arg(long)]
        key: Option<String>,
    },
    /// Confirm (pay) every line of a reserved basket.
    Confirm { basket: String },
    /// Cancel every line of a reserved basket.
    Cancel { basket: String },
}

/// `ITEM` or `ITEM=QUANTITY` (`=` is not in an item id's alphabet).
fn line(s: &str) -> Result<(String, u64), String> {
    match s.split_once('=') {
        Some((item, n)) => Ok((item.to_owned(), quantity(n)?)),
        None => Ok((s.to_owned(), 1)),
    }
}

#[derive(Serialize)]
struct LineView {
    item_id: String,
    reservation_id: String,
    quantity: u64,
    expires_at_unix_ms: i64,
    pool_generation: u64,
}

#[derive(Serialize)]
struct BasketView {
    user_id: String,
    idempotency_key: String,
    outcome: &'static str,
    basket_id: String,
    reservations: Vec<LineView>,
    short_item_id: String,
    replayed: bool,
    limit_remaining: u64,
}

#[derive(Serialize)]
struct BasketStateView {
    basket_id: String,
    state: &'static str,
}

pub async fn run(ctx: &Ctx, client: &mut AgentClient<Authed>, cmd: BasketCmd) -> Result<(), Failure> {
    match cmd {
        BasketCmd::Acquire { lines, user, key } => {
            let key = key.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let r = client
                .acquire_basket(pb::AcquireBasketRequest {
                    user_id: user.clone(),
                    idempotency_key: key.clone(),
                    lines: lines.into_iter().map(|(item_id, quantity)| pb::BasketLine { item_id, quantity }).collect(),
                })
                .await?
                .into_inner();
            let outcome = outcome_text(r.outcome());
            let view = BasketView {
                user_id: user,
                idempotency_key: key,
                outcome,
                basket_id: r.basket_id.clone(),
                reservations: r
                    .reservations
                    .iter()
                    .map(|l| LineView {
                        item_id: l.item_id.clone(),
                        reservation_id: l.reservation_id.clone(),
                        quantity: l.quantity,
                        expires_at_unix_ms: l.expires_at_unix_ms,
                        pool_generation: l.pool_generation,
                    })
                    .collect(),
                short_item_id: r.short_item_id.clone(),
                replayed: r.replayed,
                limit_remaining: r.limit_remaining,
            };
            print(ctx.output, &view, || match r.outcome() {
                pb::AcquireOutcome::Reserved => {
                    let rows = view
                        .reservations
                        .iter()
                        .map(|l| vec![l.item_id.clone(), l.quantity.to_string(), l.reservation_id.clone()])
                        .collect();
                    format!(
                        "reserved basket {} for {} (key {}{})\n{}",
                        q(&view.basket_id),
                        q(&view.user_id),
                        q(&view.idempotency_key),
                        if view.replayed { ", replayed" } else { "" },
                        table(&["ITEM", "QUANTITY", "RESERVATION"], rows)
                    )
                }
                _ => format!(
                    "{outcome}: {} for {} (key {}); nothing reserved\n",
                    q(&view.short_item_id),
                    q(&view.user_id),
                    q(&view.idempotency_key)
                ),
            });
        }
        BasketCmd::Confirm { basket } => {
            let r = client.confirm_basket(pb::ConfirmBasketRequest { basket_id: basket.clone() }).await?.into_inner();
            state_reply(ctx, basket, state_text(r.state()));
        }
        BasketCmd::Cancel { basket } => {
            let r = client.cancel_basket(pb::CancelBasketRequest { basket_id: basket.clone() }).await?.into_inner();
            state_reply(ctx, basket, state_text(r.state()));
        }
    }
    Ok(())
}

fn state_reply(ctx: &Ctx, basket_id: String, state: &'static str) {
    let text = format!("basket {}: {state}\n", q(&basket_id));
    print(ctx.output, &BasketStateView { basket_id, state }, || text);
}
