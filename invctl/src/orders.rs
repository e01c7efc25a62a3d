//! `invctl events tail`, `invctl reservation show`, `invctl refund`: what an agent knows of
//! its channel's orders (its pools' reservation events and reservations).

use std::time::Duration;

use clap::{ArgGroup, Args, Subcommand};
use inventory_proto::v1 as pb;
use serde::Serialize;

use crate::Ctx;
use crate::agent::{state_reply, state_text};
use crate::conn::Failure;
use crate::output::{Output, fields, print, q, table};

#[derive(Subcommand)]
pub enum EventsCmd {
    /// The reservation events an agent's pools keep, oldest first, then (with --follow)
    /// new ones as they happen. Without --follow it stops once no event came for
    /// --idle-ms.
    Tail(TailArgs),
}

#[derive(Args)]
pub struct TailArgs {
    /// Only this item's pool (default: every item the agent sells).
    #[arg(long)]
    item: Option<String>,
    /// The first sequence to show of each pool (resume with the last seen + 1).
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Keep following new events (until --limit, or interrupted).
    #[arg(long)]
    follow: bool,
    /// Stop after this many events.
    #[arg(long)]
    limit: Option<u64>,
    /// Without --follow: stop once no event came for this long.
    #[arg(long, default_value_t = 1_000)]
    idle_ms: u64,
}

#[derive(Subcommand)]
pub enum ReservationCmd {
    /// One reservation, by id or by idempotency key.
    Show(ShowArgs),
}

#[derive(Args)]
#[command(group(ArgGroup::new("which").required(true).args(["id", "key"])))]
pub struct ShowArgs {
    #[arg(long)]
    item: String,
    /// The reservation id.
    #[arg(long)]
    id: Option<String>,
    /// The idempotency key that reserved it.
    #[arg(long)]
    key: Option<String>,
}

#[derive(Args)]
pub struct RefundArgs {
    #[arg(long)]
    item: String,
    /// The confirmed reservation to refund.
    #[arg(long)]
    id: String,
}

#[derive(Serialize)]
struct EventView<'a> {
    event_id: &'a str,
    channel: &'a str,
    item_id: &'a str,
    segment: u32,
    sequence: u64,
    pool_generation: u64,
    reservation_id: &'a str,
    idempotency_key: &'a str,
    user_id: &'a str,
    quantity: u64,
    state: &'static str,
    previous_state: &'static str,
    at_unix_ms: i64,
}

impl<'a> EventView<'a> {
    fn of(e: &'a pb::ReservationEvent) -> Self {
        Self {
            event_id: &e.event_id,
            channel: &e.channel,
            item_id: &e.item_id,
            segment: e.segment,
            sequence: e.sequence,
            pool_generation: e.pool_generation,
            reservation_id: &e.reservation_id,
            idempotency_key: &e.idempotency_key,
            user_id: &e.user_id,
            quantity: e.quantity,
            state: state_text(e.state()),
            previous_state: match e.previous_state() {
                pb::ReservationState::Unspecified => "",
                s => state_text(s),
            },
            at_unix_ms: e.at_unix_ms,
        }
    }
}

#[derive(Serialize)]
struct ReservationView {
    item_id: String,
    reservation_id: String,
    idempotency_key: String,
    user_id: String,
    quantity: u64,
    state: &'static str,
    expires_at_unix_ms: i64,
    pool_generation: u64,
}

pub async fn events(ctx: &Ctx, cmd: EventsCmd) -> Result<(), Failure> {
    let EventsCmd::Tail(args) = cmd;
    let mut client = ctx.conn.agent(&ctx.agent).await?;
    let req = pb::StreamEventsRequest { from_sequence: args.from, item_id: args.item.unwrap_or_default() };
    let mut stream = client.stream_events(req).await?.into_inner();
    let idle = Duration::from_millis(args.idle_ms.max(1));
    let header = ["ITEM", "SEQ", "RESERVATION", "USER", "QTY", "STATE", "PREVIOUS", "AT_MS"];
    let mut shown: u64 = 0;
    while args.limit.is_none_or(|n| shown < n) {
        let next = if args.follow {
            stream.message().await?
        } else {
            match tokio::time::timeout(idle, stream.message()).await {
                Ok(m) => m?,
                Err(_) => break,
            }
        };
        let Some(e) = next else { break };
        let view = EventView::of(&e);
        match ctx.output {
            // One object per line, so a stream can be piped line by line.
            Output::Json => println!("{}", serde_json::to_string(&view).expect("views serialize")),
            Output::Table => {
                let row = vec![
                    e.item_id.clone(),
                    e.sequence.to_string(),
                    e.reservation_id.clone(),
                    e.user_id.clone(),
                    e.quantity.to_string(),
                    view.state.to_owned(),
                    view.previous_state.to_owned(),
                    e.at_unix_ms.to_string(),
                ];
                // The header once; columns are not aligned across lines of a live stream.
                let text = table(&header, vec![row]);
                let mut lines = text.lines();
                let head = lines.next().unwrap_or_default();
                if shown == 0 {
                    println!("{head}");
                }
                for l in lines {
                    println!("{l}");
                }
            }
        }
        shown += 1;
    }
    Ok(())
}

pub async fn reservation(ctx: &Ctx, cmd: ReservationCmd) -> Result<(), Failure> {
    let ReservationCmd::Show(args) = cmd;
    let mut client = ctx.conn.agent(&ctx.agent).await?;
    let req = pb::GetReservationRequest {
        item_id: args.item.clone(),
        reservation_id: args.id.unwrap_or_default(),
        idempotency_key: args.key.unwrap_or_default(),
    };
    let r = client.get_reservation(req).await?.into_inner().reservation.unwrap_or_default();
    let view = ReservationView {
        item_id: args.item,
        state: state_text(r.state()),
        reservation_id: r.reservation_id,
        idempotency_key: r.idempotency_key,
        user_id: r.user_id,
        quantity: r.quantity,
        expires_at_unix_ms: r.expires_at_unix_ms,
        pool_generation: r.pool_generation,
    };
    print(ctx.output, &view, || {
        fields(&[
            ("reservation", q(&view.reservation_id)),
            ("item", q(&view.item_id)),
            ("state", view.state.to_owned()),
            ("user", q(&view.user_id)),
            ("key", q(&view.idempotency_key)),
            ("quantity", view.quantity.to_string()),
            ("expires_at_ms", view.expires_at_unix_ms.to_string()),
            ("pool_generation", view.pool_generation.to_string()),
        ])
    });
    Ok(())
}

pub async fn refund(ctx: &Ctx, args: RefundArgs) -> Result<(), Failure> {
    let mut client = ctx.conn.agent(&ctx.agent).await?;
    let r =
        client.refund(pb::RefundRequest { item_id: args.item, reservation_id: args.id.clone() }).await?.into_inner();
    state_reply(ctx, args.id, state_text(r.state()));
    Ok(())
}
