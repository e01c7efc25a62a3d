//! `invctl`: operators' command line for the inventory center, and for talking to an
//! agent the way a channel backend does.
//!
//! Exit codes: 0 success, 1 reconcile found a violation, 2 the call failed (one line on
//! stderr says why).

mod table;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use inventory_proto::v1 as pb;
use inventory_proto::v1::admin_client::AdminClient;
use inventory_proto::v1::agent_client::AgentClient;
use serde_json::{Value, json};
use table::{Table, fields};
use tonic::transport::Channel;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Parser)]
#[command(name = "invctl", version, about = "Operate the inventory center: items, watermarks, reconcile")]
struct Cli {
    /// The center's gRPC address.
    #[arg(long, env = "INVENTORY_CENTER", default_value = "http://127.0.0.1:50051", global = true)]
    center: String,
    /// An agent's gRPC address, for `invctl agent ...`.
    #[arg(long, env = "INVENTORY_AGENT", default_value = "http://127.0.0.1:50052", global = true)]
    agent: String,
    /// Bearer token: the operator's for the center, a backend's for `invctl agent`.
    #[arg(long, env = "INVENTORY_TOKEN", hide_env_values = true, global = true)]
    token: Option<String>,
    /// File holding the token.
    #[arg(long, env = "INVENTORY_TOKEN_FILE", global = true)]
    token_file: Option<std::path::PathBuf>,
    /// CA (PEM) to verify an https:// center or agent.
    #[arg(long, env = "INVENTORY_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// How results are printed.
    #[arg(long, short, env = "INVENTORY_OUTPUT", value_enum, default_value = "table", global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create, inspect and restock items.
    #[command(subcommand)]
    Item(ItemCmd),
    /// Tune the low/high watermarks and batch size of pools.
    #[command(subcommand)]
    Watermark(WatermarkCmd),
    /// Check the ledger's invariants; exits 1 when one is violated.
    Reconcile {
        /// Check only this item.
        #[arg(long)]
        item: Option<String>,
    },
    /// Channels: epoch, lease, last heartbeat, what they hold and report.
    #[command(subcommand)]
    Channel(ChannelCmd),
    /// Settle a channel's in-doubt units after its pool store lost data: --sold units
    /// (what its orders show) are written off as sold, the rest go back to the center.
    Resolve {
        #[arg(long)]
        item: String,
        #[arg(long)]
        channel: String,
        #[arg(long)]
        sold: u64,
    },
    /// Take back a dead channel's unsold units (refused while its lease is live); without
    /// the agent's last report they go in doubt instead (settle with `resolve`).
    Reclaim {
        #[arg(long)]
        channel: String,
    },
    /// Talk to an agent as a channel backend would: stock, acquire, confirm, cancel.
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
}

#[derive(Subcommand)]
enum ItemCmd {
    /// Create an item (idempotent for the same definition).
    Create {
        item: String,
        #[arg(long)]
        total: u64,
        /// Units one user may hold per channel.
        #[arg(long, default_value_t = 1)]
        per_user_limit: u64,
        /// Reservation lifetime before it expires.
        #[arg(long, default_value_t = 300_000)]
        reservation_ttl_ms: u64,
        /// Default watermarks (all three, or none for defaults derived from --total).
        #[arg(long, requires_all = ["high", "batch"])]
        low: Option<u64>,
        #[arg(long, requires_all = ["low", "batch"])]
        high: Option<u64>,
        #[arg(long, requires_all = ["low", "high"])]
        batch: Option<u64>,
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
        #[arg(long)]
        quantity: u64,
        /// Defaults to a fresh id (printed, so a retry can reuse it).
        #[arg(long)]
        request_id: Option<String>,
    },
}

#[derive(Subcommand)]
enum ChannelCmd {
    /// Every channel, one line each.
    List,
    /// One channel, per item.
    Show { channel: String },
}

#[derive(Subcommand)]
enum AgentCmd {
    /// The agent's pool of an item.
    Stock { item: String },
    /// Reserve units for a user (idempotent on --key).
    Acquire {
        item: String,
        #[arg(long)]
        user: String,
        #[arg(long, default_value_t = 1)]
        quantity: u64,
        /// Idempotency key; defaults to a fresh one (printed, so a retry can reuse it).
        #[arg(long)]
        key: Option<String>,
    },
    /// Confirm (pay) a reservation.
    Confirm { item: String, reservation: String },
    /// Cancel a reservation.
    Cancel { item: String, reservation: String },
}

#[derive(Subcommand)]
enum WatermarkCmd {
    /// Set the item default, or a channel's override with --channel.
    Set {
        item: String,
        #[arg(long)]
        channel: Option<String>,
        #[arg(long)]
        low: u64,
        #[arg(long)]
        high: u64,
        #[arg(long)]
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

/// A failed call: printed as one line, exit code 2.
struct Failure(String);

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Failure(format!("{}: {}", code_name(s.code()), s.message()))
    }
}

impl From<tonic::transport::Error> for Failure {
    fn from(e: tonic::transport::Error) -> Self {
        let source = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
        Failure(format!("cannot connect: {e}{source}"))
    }
}

fn code_name(code: tonic::Code) -> String {
    // "FailedPrecondition" -> "failed precondition"
    let debug = format!("{code:?}");
    let mut out = String::new();
    for (i, ch) in debug.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            out.push(' ');
        }
        out.extend(ch.to_lowercase());
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("invctl: {message}");
            ExitCode::from(2)
        }
    }
}

/// How invctl reaches a server: address, TLS trust and token.
struct Conn {
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ca: Option<std::path::PathBuf>,
}

type Authed = tonic::service::interceptor::InterceptedService<Channel, Bearer>;

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Clone)]
struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

impl Conn {
    fn new(cli: &Cli) -> Result<Self, Failure> {
        let token = match (&cli.token, &cli.token_file) {
            (Some(t), _) => Some(t.trim().to_owned()),
            (None, Some(f)) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| Failure(format!("cannot read --token-file {}: {e}", f.display())))?
                    .trim()
                    .to_owned(),
            ),
            (None, None) => None,
        };
        let token = match token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| Failure("token is not ascii".into()))?),
            None => None,
        };
        Ok(Self { token, ca: cli.ca.clone() })
    }

    async fn channel(&self, flag: &str, url: &str) -> Result<Authed, Failure> {
        let mut endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| Failure(format!("invalid --{flag} {url:?}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(5))
            .timeout(std::time::Duration::from_secs(30));
        if url.starts_with("https://") {
            let mut tls = tonic::transport::ClientTlsConfig::new();
            if let Some(ca) = &self.ca {
                let pem = std::fs::read_to_string(ca)
                    .map_err(|e| Failure(format!("cannot read --ca {}: {e}", ca.display())))?;
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| Failure(format!("tls: {e}")))?;
        }
        let channel = endpoint.connect().await?;
        Ok(tonic::service::interceptor::InterceptedService::new(channel, Bearer(self.token.clone())))
    }
}

async fn admin(conn: &Conn, url: &str) -> Result<AdminClient<Authed>, Failure> {
    Ok(AdminClient::new(conn.channel("center", url).await?))
}

fn print(output: Output, json: Value, table: impl FnOnce() -> String) {
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&json).expect("json values serialize")),
        Output::Table => print!("{}", table()),
    }
}

fn wm_json(w: &Option<pb::Watermarks>) -> Value {
    w.as_ref().map_or(Value::Null, |w| json!({"low": w.low, "high": w.high, "batch": w.batch}))
}

fn wm_text(w: &Option<pb::Watermarks>) -> String {
    w.as_ref().map_or("-".into(), |w| format!("{}/{}/{}", w.low, w.high, w.batch))
}

fn item_json(i: &pb::Item) -> Value {
    json!({
        "item_id": i.item_id, "total": i.total, "available": i.available, "held": i.held,
        "per_user_limit": i.per_user_limit, "reservation_ttl_ms": i.reservation_ttl_ms,
        "closed": i.closed, "watermarks": wm_json(&i.watermarks),
    })
}

fn items_table(items: &[pb::Item]) -> String {
    let mut t = Table::new(&["ITEM", "TOTAL", "AVAILABLE", "HELD", "LIMIT", "TTL_MS", "LOW/HIGH/BATCH"]);
    for i in items {
        t.row(vec![
            i.item_id.clone(),
            i.total.to_string(),
            i.available.to_string(),
            i.held.to_string(),
            i.per_user_limit.to_string(),
            i.reservation_ttl_ms.to_string(),
            wm_text(&i.watermarks),
        ]);
    }
    t.render()
}

fn lease_text(c: &pb::ChannelAllocation) -> String {
    if c.epoch == 0 {
        "-".into()
    } else if c.lease_live {
        "live".into()
    } else {
        "expired".into()
    }
}

async fn agent(conn: &Conn, url: &str) -> Result<AgentClient<Authed>, Failure> {
    Ok(AgentClient::new(conn.channel("agent", url).await?))
}

fn outcome_text(o: pb::AcquireOutcome) -> &'static str {
    match o {
        pb::AcquireOutcome::Reserved => "reserved",
        pb::AcquireOutcome::SoldOut => "sold_out",
        pb::AcquireOutcome::LimitExceeded => "limit_exceeded",
        pb::AcquireOutcome::Unspecified => "unspecified",
    }
}

fn state_text(s: pb::ReservationState) -> &'static str {
    match s {
        pb::ReservationState::Reserved => "reserved",
        pb::ReservationState::Confirmed => "confirmed",
        pb::ReservationState::Cancelled => "cancelled",
        pb::ReservationState::Expired => "expired",
        pb::ReservationState::Unspecified => "unspecified",
    }
}

async fn run_agent(conn: &Conn, url: &str, out: Output, cmd: AgentCmd) -> Result<(), Failure> {
    let mut client = agent(conn, url).await?;
    match cmd {
        AgentCmd::Stock { item } => {
            let r = client.get_stock(pb::GetStockRequest { item_id: item.clone() }).await?.into_inner();
            let j = json!({"item_id": item, "available": r.available, "reserved": r.reserved, "sold": r.sold, "sold_out": r.sold_out});
            print(out, j, || {
                let mut t = Table::new(&["ITEM", "AVAILABLE", "RESERVED", "SOLD", "SOLD_OUT"]);
                t.row(vec![
                    item.clone(),
                    r.available.to_string(),
                    r.reserved.to_string(),
                    r.sold.to_string(),
                    r.sold_out.to_string(),
                ]);
                t.render()
            });
        }
        AgentCmd::Acquire { item, user, quantity, key } => {
            let key = key.unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let r = client
                .acquire(pb::AcquireRequest {
                    item_id: item.clone(),
                    user_id: user.clone(),
                    quantity,
                    idempotency_key: key.clone(),
                })
                .await?
                .into_inner();
            let outcome = outcome_text(r.outcome());
            let j = json!({"item_id": item, "user_id": user, "idempotency_key": key, "outcome": outcome,
                "reservation_id": r.reservation_id, "quantity": r.quantity, "expires_at_unix_ms": r.expires_at_unix_ms,
                "replayed": r.replayed});
            print(out, j, || match r.outcome() {
                pb::AcquireOutcome::Reserved => format!(
                    "reserved {} of {item} for {user}: reservation {} (key {key}{})\n",
                    r.quantity,
                    r.reservation_id,
                    if r.replayed { ", replayed" } else { "" }
                ),
                _ => format!("{outcome}: {item} for {user} (key {key})\n"),
            });
        }
        AgentCmd::Confirm { item, reservation } => {
            let r = client
                .confirm(pb::ConfirmRequest { item_id: item, reservation_id: reservation.clone() })
                .await?
                .into_inner();
            let state = state_text(r.state());
            print(out, json!({"reservation_id": reservation, "state": state}), || {
                format!("reservation {reservation}: {state}\n")
            });
        }
        AgentCmd::Cancel { item, reservation } => {
            let r = client
                .cancel(pb::CancelRequest { item_id: item, reservation_id: reservation.clone() })
                .await?
                .into_inner();
            let state = state_text(r.state());
            print(out, json!({"reservation_id": reservation, "state": state}), || {
                format!("reservation {reservation}: {state}\n")
            });
        }
    }
    Ok(())
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let out = cli.output;
    let conn = Conn::new(&cli)?;
    match cli.command {
        Command::Agent(cmd) => run_agent(&conn, &cli.agent, out, cmd).await?,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "invctl", &mut std::io::stdout());
        }
        Command::Item(ItemCmd::Create { item, total, per_user_limit, reservation_ttl_ms, low, high, batch }) => {
            let watermarks = match (low, high, batch) {
                (Some(low), Some(high), Some(batch)) => Some(pb::Watermarks { low, high, batch }),
                _ => None,
            };
            let r = admin(&conn, &cli.center)
                .await?
                .create_item(pb::CreateItemRequest {
                    item_id: item,
                    total,
                    per_user_limit,
                    reservation_ttl_ms,
                    watermarks,
                })
                .await?
                .into_inner();
            let i = r.item.unwrap_or_default();
            let mut j = item_json(&i);
            j["created"] = json!(r.created);
            print(out, j, || {
                let verb = if r.created { "created" } else { "already exists (same definition)" };
                format!("item {} {verb}\n{}", i.item_id, items_table(std::slice::from_ref(&i)))
            });
        }
        Command::Item(ItemCmd::Show { item }) => {
            let r = admin(&conn, &cli.center).await?.get_item(pb::GetItemRequest { item_id: item }).await?.into_inner();
            let i = r.item.unwrap_or_default();
            let channels: Vec<Value> = r
                .channels
                .iter()
                .map(|c| {
                    json!({
                        "channel": c.channel, "held": c.held, "granted": c.granted, "returned": c.returned,
                        "reclaimed": c.reclaimed, "reported": {"available": c.reported_available,
                        "reserved": c.reported_reserved, "sold": c.reported_sold, "at_unix_ms": c.reported_at_unix_ms},
                        "drift": c.drift, "epoch": c.epoch, "lease_expires_at_unix_ms": c.lease_expires_at_unix_ms,
                        "lease_live": c.lease_live, "watermarks": wm_json(&c.watermarks),
                    })
                })
                .collect();
            let mut j = item_json(&i);
            j["channels"] = Value::Array(channels);
            print(out, j, || {
                let mut text = fields(&[
                    ("item", i.item_id.clone()),
                    ("total", i.total.to_string()),
                    ("center available", i.available.to_string()),
                    ("held by channels", i.held.to_string()),
                    ("per-user limit", i.per_user_limit.to_string()),
                    ("reservation ttl", format!("{} ms", i.reservation_ttl_ms)),
                    ("watermarks", wm_text(&i.watermarks)),
                    ("state", if i.closed { "closed".into() } else { "open".into() }),
                ]);
                if !r.channels.is_empty() {
                    let mut t = Table::new(&[
                        "CHANNEL",
                        "HELD",
                        "GRANTED",
                        "RETURNED",
                        "RECLAIMED",
                        "AVAILABLE",
                        "RESERVED",
                        "SOLD",
                        "DRIFT",
                        "EPOCH",
                        "LEASE",
                        "LOW/HIGH/BATCH",
                    ]);
                    for c in &r.channels {
                        t.row(vec![
                            c.channel.clone(),
                            c.held.to_string(),
                            c.granted.to_string(),
                            c.returned.to_string(),
                            c.reclaimed.to_string(),
                            c.reported_available.to_string(),
                            c.reported_reserved.to_string(),
                            c.reported_sold.to_string(),
                            c.drift.to_string(),
                            c.epoch.to_string(),
                            lease_text(c),
                            wm_text(&c.watermarks),
                        ]);
                    }
                    text.push('\n');
                    text.push_str(&t.render());
                }
                text
            });
        }
        Command::Item(ItemCmd::Close { item, reopen }) => {
            let r = admin(&conn, &cli.center)
                .await?
                .close_item(pb::CloseItemRequest { item_id: item.clone(), closed: !reopen })
                .await?
                .into_inner();
            let i = r.item.unwrap_or_default();
            print(out, item_json(&i), || {
                format!("item {item} {}\n", if i.closed { "closed: no more grants" } else { "open" })
            });
        }
        Command::Channel(cmd) => {
            let wanted = match &cmd {
                ChannelCmd::List => String::new(),
                ChannelCmd::Show { channel } => channel.clone(),
            };
            let r = admin(&conn, &cli.center)
                .await?
                .list_channels(pb::ListChannelsRequest { channel: wanted })
                .await?
                .into_inner();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            let j: Vec<Value> = r
                .channels
                .iter()
                .map(|c| {
                    json!({"channel": c.channel, "agent_id": c.agent_id, "epoch": c.epoch,
                        "lease_expires_at_unix_ms": c.lease_expires_at_unix_ms, "lease_live": c.lease_live,
                        "last_heartbeat_unix_ms": c.last_heartbeat_unix_ms,
                        "items": c.items.iter().map(|i| json!({"item_id": i.item_id, "held": i.held,
                            "reported": {"available": i.reported_available, "reserved": i.reported_reserved, "sold": i.reported_sold},
                            "drift": i.drift, "in_doubt": i.in_doubt})).collect::<Vec<_>>()})
                })
                .collect();
            let lease = |c: &pb::ChannelInfo| {
                if c.lease_live {
                    format!("live ({} ms left)", c.lease_expires_at_unix_ms - now)
                } else {
                    format!("expired {} ms ago", now - c.lease_expires_at_unix_ms)
                }
            };
            let ago = |t: i64| format!("{} ms ago", now - t);
            print(out, Value::Array(j), || match cmd {
                ChannelCmd::List => {
                    let mut t = Table::new(&[
                        "CHANNEL",
                        "AGENT",
                        "EPOCH",
                        "LEASE",
                        "LAST HEARTBEAT",
                        "ITEMS",
                        "HELD",
                        "DRIFT",
                        "IN DOUBT",
                    ]);
                    for c in &r.channels {
                        t.row(vec![
                            c.channel.clone(),
                            c.agent_id.clone(),
                            c.epoch.to_string(),
                            lease(c),
                            ago(c.last_heartbeat_unix_ms),
                            c.items.len().to_string(),
                            c.items.iter().map(|i| i.held).sum::<u64>().to_string(),
                            c.items.iter().map(|i| i.drift).sum::<i64>().to_string(),
                            c.items.iter().map(|i| i.in_doubt).sum::<u64>().to_string(),
                        ]);
                    }
                    t.render()
                }
                ChannelCmd::Show { .. } => {
                    let mut text = String::new();
                    for c in &r.channels {
                        text.push_str(&fields(&[
                            ("channel", c.channel.clone()),
                            ("agent", c.agent_id.clone()),
                            ("epoch", c.epoch.to_string()),
                            ("lease", lease(c)),
                            ("last heartbeat", ago(c.last_heartbeat_unix_ms)),
                        ]));
                        let mut t = Table::new(&["ITEM", "HELD", "AVAILABLE", "RESERVED", "SOLD", "DRIFT", "IN DOUBT"]);
                        for i in &c.items {
                            t.row(vec![
                                i.item_id.clone(),
                                i.held.to_string(),
                                i.reported_available.to_string(),
                                i.reported_reserved.to_string(),
                                i.reported_sold.to_string(),
                                i.drift.to_string(),
                                i.in_doubt.to_string(),
                            ]);
                        }
                        text.push('\n');
                        text.push_str(&t.render());
                    }
                    text
                }
            });
        }
        Command::Resolve { item, channel, sold } => {
            let r = admin(&conn, &cli.center)
                .await?
                .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: item.clone(), channel: channel.clone(), sold })
                .await?
                .into_inner();
            let j = json!({"item_id": item, "channel": channel, "written_off": r.written_off,
                "returned_to_center": r.returned_to_center, "item": r.item.as_ref().map(item_json)});
            print(out, j, || {
                format!(
                    "{item} in channel {channel}: {} written off as sold, {} back at the center\n",
                    r.written_off, r.returned_to_center
                )
            });
        }
        Command::Item(ItemCmd::List) => {
            let r = admin(&conn, &cli.center).await?.list_items(pb::ListItemsRequest {}).await?.into_inner();
            print(out, Value::Array(r.items.iter().map(item_json).collect()), || items_table(&r.items));
        }
        Command::Item(ItemCmd::AddStock { item, quantity, request_id }) => {
            let request_id = request_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            let r = admin(&conn, &cli.center)
                .await?
                .add_stock(pb::AddStockRequest { item_id: item, quantity, request_id: request_id.clone() })
                .await?
                .into_inner();
            let i = r.item.unwrap_or_default();
            let mut j = item_json(&i);
            j["request_id"] = json!(request_id);
            j["replayed"] = json!(r.replayed);
            print(out, j, || {
                let note = if r.replayed { " (replay: already applied)" } else { "" };
                format!(
                    "added {quantity} to {} (request id {request_id}){note}\n{}",
                    i.item_id,
                    items_table(std::slice::from_ref(&i))
                )
            });
        }
        Command::Watermark(WatermarkCmd::Set { item, channel, low, high, batch }) => {
            let target = channel.clone().unwrap_or_default();
            let r = admin(&conn, &cli.center)
                .await?
                .set_watermarks(pb::SetWatermarksRequest {
                    item_id: item.clone(),
                    channel: target.clone(),
                    low,
                    high,
                    batch,
                })
                .await?
                .into_inner();
            let scope = if target.is_empty() { "default".to_owned() } else { format!("channel {target}") };
            print(out, json!({"item_id": item, "channel": target, "watermarks": wm_json(&r.watermarks)}), || {
                format!("watermarks of {item} ({scope}) set to low/high/batch {}\n", wm_text(&r.watermarks))
            });
        }
        Command::Watermark(WatermarkCmd::Get { item, channel: Some(channel) }) => {
            let r = admin(&conn, &cli.center)
                .await?
                .get_watermarks(pb::GetWatermarksRequest { item_id: item.clone() })
                .await?
                .into_inner();
            let own = r.overrides.iter().find(|o| o.channel == channel);
            let (source, w) = match own {
                Some(o) => ("channel", &o.watermarks),
                None => ("default", &r.default_watermarks),
            };
            print(
                out,
                json!({"item_id": item, "channel": channel, "source": source, "watermarks": wm_json(w)}),
                || {
                    let mut t = Table::new(&["CHANNEL", "LOW", "HIGH", "BATCH", "FROM"]);
                    let w = w.unwrap_or_default();
                    let from = if own.is_some() { "channel override" } else { "item default" };
                    t.row(vec![
                        channel.clone(),
                        w.low.to_string(),
                        w.high.to_string(),
                        w.batch.to_string(),
                        from.into(),
                    ]);
                    t.render()
                },
            );
        }
        Command::Watermark(WatermarkCmd::Get { item, channel: None }) => {
            let r = admin(&conn, &cli.center)
                .await?
                .get_watermarks(pb::GetWatermarksRequest { item_id: item.clone() })
                .await?
                .into_inner();
            let overrides: Vec<Value> = r
                .overrides
                .iter()
                .map(|o| json!({"channel": o.channel, "watermarks": wm_json(&o.watermarks)}))
                .collect();
            print(
                out,
                json!({"item_id": item, "default": wm_json(&r.default_watermarks), "overrides": overrides}),
                || {
                    let mut t = Table::new(&["CHANNEL", "LOW", "HIGH", "BATCH"]);
                    let mut add = |name: String, w: &Option<pb::Watermarks>| {
                        let w = w.unwrap_or_default();
                        t.row(vec![name, w.low.to_string(), w.high.to_string(), w.batch.to_string()]);
                    };
                    add("(default)".into(), &r.default_watermarks);
                    for o in &r.overrides {
                        add(o.channel.clone(), &o.watermarks);
                    }
                    t.render()
                },
            );
        }
        Command::Reconcile { item } => {
            let r = admin(&conn, &cli.center)
                .await?
                .reconcile(pb::ReconcileRequest { item_id: item.unwrap_or_default() })
                .await?
                .into_inner();
            let finding = |v: &pb::Violation| json!({"item_id": v.item_id, "channel": v.channel, "invariant": v.invariant, "detail": v.detail});
            let j = json!({
                "ok": r.ok, "items_checked": r.items_checked,
                "violations": r.violations.iter().map(finding).collect::<Vec<_>>(),
                "drifts": r.drifts.iter().map(finding).collect::<Vec<_>>(),
                "in_doubt": r.in_doubt.iter().map(finding).collect::<Vec<_>>(),
            });
            print(out, j, || {
                let verdict = if r.ok { "ok: no invariant violated" } else { "VIOLATED" };
                let mut text = format!("{verdict} ({} items checked)\n", r.items_checked);
                let rows: Vec<(&str, &pb::Violation)> = r
                    .violations
                    .iter()
                    .map(|v| ("violation", v))
                    .chain(r.drifts.iter().map(|v| ("drift", v)))
                    .chain(r.in_doubt.iter().map(|v| ("in doubt", v)))
                    .collect();
                if !rows.is_empty() {
                    let mut t = Table::new(&["KIND", "ITEM", "CHANNEL", "RULE", "DETAIL"]);
                    for (kind, v) in rows {
                        t.row(vec![
                            kind.into(),
                            v.item_id.clone(),
                            v.channel.clone(),
                            v.invariant.clone(),
                            v.detail.clone(),
                        ]);
                    }
                    text.push_str(&t.render());
                }
                text
            });
            if !r.ok {
                return Ok(ExitCode::from(1));
            }
        }
        Command::Reclaim { channel } => {
            let r = admin(&conn, &cli.center)
                .await?
                .reclaim(pb::ReclaimRequest { channel: channel.clone() })
                .await?
                .into_inner();
            let items: Vec<Value> = r
                .items
                .iter()
                .map(|i| json!({"item_id": i.item_id, "reclaimed": i.reclaimed, "in_doubt": i.in_doubt}))
                .collect();
            print(out, json!({"channel": channel, "new_epoch": r.new_epoch, "items": items}), || {
                let mut t = Table::new(&["ITEM", "RECLAIMED", "IN DOUBT"]);
                for i in &r.items {
                    t.row(vec![i.item_id.clone(), i.reclaimed.to_string(), i.in_doubt.to_string()]);
                }
                format!("channel {channel} fenced at epoch {}\n{}", r.new_epoch, t.render())
            });
        }
    }
    Ok(ExitCode::SUCCESS)
}
