//! `order-sink`: the reference order consumer (see the library's doc).

use clap::Parser;

#[derive(Debug, Parser)]
#[command(name = "order-sink", about = "Reservation events from JetStream into a PostgreSQL orders table")]
struct Args {
    #[arg(long, env = "ORDER_SINK_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long, env = "ORDER_SINK_STREAM", default_value = "INVENTORY_EVENTS")]
    stream: String,
    /// Subjects of the stream, when this creates it: `<prefix>.>`.
    #[arg(long, env = "ORDER_SINK_SUBJECT_PREFIX", default_value = "inventory.events")]
    subject_prefix: String,
    /// The durable consumer's name: a restarted sink goes on where it stopped.
    #[arg(long, env = "ORDER_SINK_DURABLE", default_value = "order-sink")]
    durable: String,
    #[arg(long, env = "ORDER_SINK_DATABASE_URL")]
    database_url: String,
    /// Messages per fetch, committed in one transaction.
    #[arg(long, env = "ORDER_SINK_BATCH", default_value_t = 256)]
    batch: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let a = Args::parse();
    let config = order_sink::SinkConfig {
        nats_url: a.nats_url,
        stream: a.stream,
        subject_prefix: a.subject_prefix,
        durable: a.durable,
        database_url: a.database_url,
        batch: a.batch,
    };
    order_sink::run(config, shutdown()).await
}

/// SIGTERM or Ctrl-C.
async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
