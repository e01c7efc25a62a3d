//! `inventory-bench`: a load generator for Agent/Acquire and the one-command benchmark
//! that measures the brief's yardsticks side by side (see BENCHMARKS.md).
//!
//! - [`load`]: the driver (callers, warm-up, bounds, open/closed loop, HDR histograms);
//! - [`acquire`]: the Acquire workload and its outcome check; [`callers`]: the others;
//!   [`batching`]: figure (ii), Borrow calls per 1,000 acquires by batching; [`stocking`]:
//!   figure (iii), stocking 100,000 items through one agent (alone: `stocking`); [`opening`]: figure (iv), the
//!   opening second of a scheduled sale beside an unscheduled one;
//! - [`skew`], [`stats`], [`args`], [`report`]: pure helpers; [`auth`]: token and TLS of `acquire`; [`sysinfo`]: machine and CPU use;
//! - [`segments`]: figure (i) of segmented stock, one segment against eight on a Redis Cluster;
//! - [`memory`]: Redis bytes per live reservation, on a private redis-server;
//! - [`env`]: fresh database, Redis prefix, in-process center and agents; [`suite`]: the run.
//!
//! **Invariant:** traffic goes only to this machine (loopback addresses; anything else is
//! refused), and every run is bounded in time and in count.

// The servers run in this process: the same allocator as their own binaries.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod acquire;
mod args;
mod auth;
mod batching;
mod callers;
mod cli;
mod env;
mod light;
mod load;
mod memory;
mod opening;
mod report;
mod segments;
mod skew;
mod stats;
mod stocking;
mod suite;
mod sysinfo;

use clap::Parser;

fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    let cli = cli::Cli::parse();
    let client = runtime("bench-client", cli.client_threads)?;
    let ok = match cli.command {
        cli::Command::Acquire(args) => client.block_on(cli::acquire(args))?,
        cli::Command::Segments(args) => client.block_on(segments::run(args))?,
        cli::Command::Memory(args) => client.block_on(memory::run(args))?,
        cli::Command::Opening(args) => {
            let servers = runtime("bench-servers", 2)?;
            let ok = client.block_on(opening::run_alone(args, servers.handle().clone()));
            servers.shutdown_timeout(std::time::Duration::from_secs(5));
            ok?
        }
        cli::Command::Stocking(args) => {
            let servers = runtime("bench-servers", 2)?;
            let ok = client.block_on(stocking::run_alone(args, servers.handle().clone()));
            servers.shutdown_timeout(std::time::Duration::from_secs(5));
            ok?
        }
        cli::Command::Suite(args) => {
            let options = args.options()?;
            // Servers get their own worker threads, as separate processes would.
            let servers = runtime("bench-servers", 2)?;
            let ok = client.block_on(suite::run(options, servers.handle().clone()));
            servers.shutdown_timeout(std::time::Duration::from_secs(5));
            ok?
        }
    };
    if !ok {
        eprintln!("outcome check failed: more units reserved than stock, or a replay got another reservation");
        std::process::exit(1);
    }
    Ok(())
}

fn runtime(name: &str, threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads.max(1)).thread_name(name).enable_all().build()
}
