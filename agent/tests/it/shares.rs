//! Channel shares at the opening and under load, on the memory store and on Redis: the
//! pools are stocked by weight for the opening; a capped channel under a fast buyer load
//! never holds more than its cap; a slow channel's floor is kept while a fast channel
//! sells out and every channel is asked to give back its idle units.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::{TestRedis, wait_until};
use tonic::transport::Channel;

use crate::harness::{Center, LocalAgent, StoreSpec, acquire_req, stock};

const ITEM: &str = "launch";

fn now_ms() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

fn share(channel: &str, weight: u64, cap_units: u64, floor_units: u64) -> pb::ChannelShare {
    pb::ChannelShare { channel: channel.into(), weight, cap_units, floor_units }
}

/// Buys one unit at a time as `tag`'s users until the channel answers SOLD_OUT; returns
/// the units reserved. `pause` between calls (a slow channel's buyers) until `hurry`. With
/// `patience` a SOLD_OUT ends it only once `hurry` is set and nothing was reserved for that
/// long (at the end of a sale a pool that gave back its idle units borrows on misses, so
/// one SOLD_OUT is not the last word).
async fn buy_until_sold_out(
    mut client: AgentClient<Channel>,
    tag: String,
    pause: Duration,
    hurry: Arc<AtomicBool>,
    patience: Duration,
) -> u64 {
    let mut reserved = 0;
    let mut last_reserved = tokio::time::Instant::now();
    for n in 0u64.. {
        let request = acquire_req(ITEM, &format!("{tag}-u{n}"), 1, &format!("{tag}-k{n}"));
        let mut waited = 0;
        let r = loop {
            match client.acquire(request.clone()).await {
                Ok(r) => break r.into_inner(),
                // A Borrow's outcome not settled yet (a busy center): the same key again.
                Err(s) if s.code() == tonic::Code::Unavailable && waited < 500 => {
                    waited += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(s) => panic!("{tag}: {s:?}"),
            }
        };
        match r.outcome() {
            pb::AcquireOutcome::Reserved => {
                reserved += 1;
                last_reserved = tokio::time::Instant::now();
            }
            pb::AcquireOutcome::SoldOut if patience.is_zero() => return reserved,
            pb::AcquireOutcome::SoldOut => {
                if hurry.load(Ordering::SeqCst) && last_reserved.elapsed() > patience {
                    return reserved;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            pb::AcquireOutcome::NotStarted => {}
            other => panic!("{tag}: {other:?}"),
        }
        if !pause.is_zero() && !hurry.load(Ordering::SeqCst) {
            tokio::time::sleep(pause).await;
        }
    }
    unreachable!()
}

async fn caps_and_floors_hold_under_a_fast_channels_load(redis: bool) {
    let center = Center::start_postgres().await;
    let test_redis = if redis { Some(TestRedis::create().await) } else { None };
    let spec = match &test_redis {
        Some(r) => StoreSpec::Redis { url: r.url.clone(), prefix: r.prefix.clone() },
        None => StoreSpec::Memory,
    };
    let mut agents = Vec::new();
    for channel in ["fast", "partner", "slow"] {
        agents.push(LocalAgent::start(&center.url, channel, &spec).await);
    }
    // 900 shared at the opening: the slow channel's floor of 200 first, 700 by weight
    // (560 / 70 / 70); the partner is capped at 150 units for the whole sale.
    let plan = vec![share("fast", 80, 0, 0), share("partner", 10, 150, 0), share("slow", 10, 0, 200)];
    let opens_at = now_ms() + 4_000;
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: ITEM.into(),
            total: 1_000,
            per_user_limit: 2,
            opens_at_unix_ms: opens_at,
            prestock_lead_ms: 3_000,
            center_reserve: Some(100),
            channel_shares: plan,
            ..Default::default()
        })
        .await
        .expect("create item");
    let mut clients = Vec::new();
    for a in &agents {
        clients.push(a.client().await);
    }
    let stocked = wait_until(Duration::from_secs(10), || {
        let clients = clients.clone();
        async move {
            let mut each = Vec::new();
            for mut c in clients {
                each.push(stock(&mut c, ITEM).await.available);
            }
            each == [560, 70, 270]
        }
    })
    .await;
    assert!(stocked, "stocked by weight: {:?}", center.ledger(ITEM).await);
    assert!(now_ms() < opens_at, "stocked before the opening");

    // Watch the partner's holding at the center all along.
    let done = Arc::new(AtomicBool::new(false));
    let most_held = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (done, most_held) = (Arc::clone(&done), Arc::clone(&most_held));
        let mut admin = center.admin().await;
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                // A busy database may refuse a snapshot read: the next one counts.
                let Ok(view) = admin.get_item(pb::GetItemRequest { item_id: ITEM.into() }).await else { continue };
                let view = view.into_inner();
                let held = view.channels.iter().find(|c| c.channel == "partner").map_or(0, |c| c.held);
                most_held.fetch_max(held, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    // Open: fast buyers on the fast and partner channels, a slow one on the slow channel.
    let mut fast = Vec::new();
    for (i, tag) in ["fast", "partner"].iter().enumerate() {
        for n in 0..8 {
            let client = clients[i].clone();
            let hurry = Arc::new(AtomicBool::new(true));
            fast.push(tokio::spawn(buy_until_sold_out(
                client,
                format!("{tag}{n}"),
                Duration::ZERO,
                hurry,
                Duration::ZERO,
            )));
        }
    }
    let hurry = Arc::new(AtomicBool::new(false));
    let slow = tokio::spawn(buy_until_sold_out(
        clients[2].clone(),
        "slow".into(),
        Duration::from_millis(100),
        Arc::clone(&hurry),
        Duration::from_secs(3),
    ));
    let mut fast_sold = Vec::new();
    for t in fast {
        fast_sold.push(t.await.expect("a fast buyer"));
    }
    let (fast_units, partner_units) = (fast_sold[..8].iter().sum::<u64>(), fast_sold[8..].iter().sum::<u64>());
    // The fast channel is sold out; the slow channel's floor is still there for it.
    let view = center.ledger(ITEM).await;
    let slow_line = view.channels.iter().find(|c| c.channel == "slow").cloned().expect("slow line");
    let center_available = view.item.as_ref().unwrap().available;
    assert!(slow_line.held + center_available >= 200, "the floor kept while the fast channel sold out: {view:?}");
    hurry.store(true, Ordering::SeqCst);
    let slow_units = slow.await.expect("the slow buyer");
    done.store(true, Ordering::SeqCst);
    watcher.await.expect("watcher");
    assert!(most_held.load(Ordering::SeqCst) <= 150, "the partner held {} once", most_held.load(Ordering::SeqCst));
    assert!(partner_units <= 150, "the partner sold {partner_units}");
    assert!(slow_units >= 200, "the slow channel sold {slow_units} of its floor of 200 (fast {fast_units})");
    assert!(fast_units + partner_units + slow_units <= 1_000, "never oversold");
    let r = center.await_quiescence().await;
    assert!(r.ok, "{r:?}");
    drop(agents);
}

mod memory {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caps_and_floors_hold_under_a_fast_channels_load() {
        super::caps_and_floors_hold_under_a_fast_channels_load(false).await;
    }
}

mod redis {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn caps_and_floors_hold_under_a_fast_channels_load() {
        super::caps_and_floors_hold_under_a_fast_channels_load(true).await;
    }
}
