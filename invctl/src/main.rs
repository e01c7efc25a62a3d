//! `invctl`: operators' command line for the inventory center, and for talking to an
//! agent the way a channel backend does. One module per command group; `conn` reaches the
//! servers, `output` prints views as tables or JSON.
//!
//! Exit codes: 0 success; 1 reconcile found a violated invariant; 2 the call failed or the
//! command line is wrong (one line on stderr says why); 3 reconcile found units in doubt
//! (nothing violated, but an operator must `resolve` them).

mod agent;
mod args;
mod basket;
mod channel;
mod conn;
mod item;
mod order_check;
mod orders;
mod output;
mod reconcile;
mod watermark;
mod when;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use conn::{Conn, ConnArgs, Failure};
use output::Output;

#[derive(Parser)]
#[command(name = "invctl", version, about = "Operate the inventory center: items, watermarks, reconcile")]
struct Cli {
    /// The center's gRPC address.
    #[arg(long, env = "INVENTORY_CENTER", default_value = "http://127.0.0.1:50051", global = true)]
    center: String,
    /// An agent's gRPC address, for `invctl agent ...`.
    #[arg(long, env = "INVENTORY_AGENT", default_value = "http://127.0.0.1:50052", global = true)]
    agent: String,
    #[command(flatten)]
    conn: ConnArgs,
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
    Item(item::ItemCmd),
    /// Tune the low/high watermarks and batch size of pools.
    #[command(subcommand)]
    Watermark(watermark::WatermarkCmd),
    /// Check the ledger's invariants; exits 1 when one is violated, 3 while units are in
    /// doubt.
    Reconcile(reconcile::ReconcileArgs),
    /// Channels: epoch, lease, last heartbeat, what they hold and report.
    #[command(subcommand)]
    Channel(channel::ChannelCmd),
    /// Settle a channel's in-doubt units after its pool store lost data: --sold units
    /// (what its orders show) are written off as sold, the rest go back to the center.
    Resolve(reconcile::ResolveArgs),
    /// Take back a dead channel's unsold units (refused while its lease is live); without
    /// the agent's last report they go in doubt instead (settle with `resolve`).
    Reclaim(channel::ReclaimArgs),
    /// Talk to an agent as a channel backend would: stock, acquire, confirm, cancel.
    #[command(subcommand)]
    Agent(agent::AgentCmd),
    /// An agent's reservation events (its pools' outboxes): `events tail`.
    #[command(subcommand)]
    Events(orders::EventsCmd),
    /// One reservation as the agent's pool knows it: `reservation show`.
    #[command(subcommand)]
    Reservation(orders::ReservationCmd),
    /// Refund a confirmed reservation: its units go back on sale.
    Refund(orders::RefundArgs),
    /// Print shell completions.
    Completions { shell: clap_complete::Shell },
}

/// What every command gets: how to reach the servers and how to print.
pub struct Ctx {
    pub conn: Conn,
    pub center: String,
    pub agent: String,
    pub output: Output,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help, --version, and the help shown for a missing subcommand.
        Err(e) if !e.use_stderr() || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            e.exit()
        }
        Err(e) => {
            eprintln!("invctl: {}", usage_error(&e));
            return ExitCode::from(2);
        }
    };
    match run(cli).await {
        Ok(code) => code,
        Err(Failure(message)) => {
            eprintln!("invctl: {message}");
            ExitCode::from(2)
        }
    }
}

/// A bad command line as one line, like every other failure: clap's message without its
/// usage block.
fn usage_error(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let message: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    let message = message.join(" ");
    format!("{} (see --help)", message.strip_prefix("error: ").unwrap_or(&message))
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let ctx = Ctx { conn: Conn::new(&cli.conn)?, center: cli.center, agent: cli.agent, output: cli.output };
    match cli.command {
        Command::Item(cmd) => item::run(&ctx, cmd).await?,
        Command::Watermark(cmd) => watermark::run(&ctx, cmd).await?,
        Command::Reconcile(args) => return reconcile::reconcile(&ctx, args).await,
        Command::Resolve(args) => reconcile::resolve(&ctx, args).await?,
        Command::Channel(cmd) => channel::run(&ctx, cmd).await?,
        Command::Reclaim(args) => channel::reclaim(&ctx, args).await?,
        Command::Agent(cmd) => agent::run(&ctx, cmd).await?,
        Command::Events(cmd) => orders::events(&ctx, cmd).await?,
        Command::Reservation(cmd) => orders::reservation(&ctx, cmd).await?,
        Command::Refund(args) => orders::refund(&ctx, args).await?,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "invctl", &mut std::io::stdout());
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}
