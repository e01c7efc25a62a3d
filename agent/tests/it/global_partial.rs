//! `allow_partial` under a global per-user limit: an Acquire that asks for more than the
//! user's allowance has left over all channels reserves what is left (LIMIT_EXCEEDED only
//! when nothing is), replays of its key answer the same reservation, and users racing on
//! two channels end with exactly their allowance, never more.

use std::collections::BTreeMap;

use futures::StreamExt;
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use inventory_test_support::TestRedis;
use tonic::transport::Channel;

use crate::harness::{AgentProcess, Center, StoreSpec, acquire_req, stock};

const LIMIT: u64 = 5;

async fn create(center: &Center, item: &str, total: u64) {
    center
        .admin()
        .await
        .create_item(pb::CreateItemRequest {
            item_id: item.into(),
            total,
            per_user_limit: LIMIT,
            reservation_ttl_ms: 300_000,
            watermarks: Some(pb::Watermarks { low: 50, high: 600, batch: 300 }),
            limit_scope: pb::LimitScope::Global.into(),
            ..Default::default()
        })
        .await
        .expect("create item");
}

async fn agents(center: &Center, redis: &TestRedis) -> (AgentProcess, AgentProcess) {
    let store = StoreSpec::Redis { url: redis.url.clone(), prefix: redis.prefix.clone() };
    let flags = [
        "--buyer-registry-url",
        &redis.url,
        "--buyer-registry-prefix",
        &redis.prefix,
        "--user-rate-per-sec",
        "10000",
        "--user-burst",
        "10000",
    ];
    let app = AgentProcess::spawn_with(&center.url, "app", &store, None, "app-p", &flags).await;
    let web = AgentProcess::spawn_with(&center.url, "web", &store, None, "web-p", &flags).await;
    (app, web)
}

async fn partial(
    client: &mut AgentClient<Channel>,
    item: &str,
    user: &str,
    quantity: u64,
    key: &str,
) -> pb::AcquireResponse {
    let req = pb::AcquireRequest { allow_partial: true, ..acquire_req(item, user, quantity, key) };
    client.acquire(req).await.expect("acquire").into_inner()
}

const RESERVED: i32 = pb::AcquireOutcome::Reserved as i32;
const OVER: i32 = pb::AcquireOutcome::LimitExceeded as i32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_acquire_reserves_what_the_global_allowance_has_left() {
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create(&center, "bundle", 1_000).await;
    let (app, web) = agents(&center, &redis).await;
    let (mut app, mut web) = (app.client().await, web.client().await);

    // 3 on app, then 4 asked on web with 2 left over all channels: 2 reserved.
    let first = partial(&mut app, "bundle", "u", 3, "u-app-1").await;
    assert_eq!((first.outcome, first.quantity), (RESERVED, 3), "{first:?}");
    let short = partial(&mut web, "bundle", "u", 4, "u-web-1").await;
    assert_eq!((short.outcome, short.quantity, short.replayed), (RESERVED, 2, false), "{short:?}");
    // A replay with the asked quantity answers that reservation, reserving nothing more.
    let again = partial(&mut web, "bundle", "u", 4, "u-web-1").await;
    assert_eq!((again.outcome, again.quantity, again.replayed), (RESERVED, 2, true), "{again:?}");
    assert_eq!(again.reservation_id, short.reservation_id);
    // Nothing left: LIMIT_EXCEEDED with nothing remaining, on either channel.
    for (client, key) in [(&mut app, "u-app-2"), (&mut web, "u-web-2")] {
        let none = partial(client, "bundle", "u", 1, key).await;
        assert_eq!((none.outcome, none.limit_remaining), (OVER, 0), "{none:?}");
    }
    // Without allow_partial the old answer stands: LIMIT_EXCEEDED naming what is left.
    let other = partial(&mut app, "bundle", "v", 2, "v-app-1").await;
    assert_eq!((other.outcome, other.quantity), (RESERVED, 2));
    let whole = app.acquire(acquire_req("bundle", "v", 4, "v-app-2")).await.expect("acquire").into_inner();
    assert_eq!((whole.outcome, whole.limit_remaining), (OVER, 3), "{whole:?}");

    // Cancelling frees the allowance over all channels: the next partial Acquire gets it.
    app.cancel(pb::CancelRequest { item_id: "bundle".into(), reservation_id: first.reservation_id.clone() })
        .await
        .expect("cancel");
    let after = partial(&mut web, "bundle", "u", 4, "u-web-3").await;
    assert_eq!((after.outcome, after.quantity), (RESERVED, 3), "{after:?}");
    let reserved = stock(&mut app, "bundle").await.reserved + stock(&mut web, "bundle").await.reserved;
    assert_eq!(reserved, 2 + 3 + 2, "u holds 2 + 3, v holds 2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn users_racing_partial_acquires_on_two_channels_end_with_exactly_their_allowance() {
    const USERS: usize = 300;
    let redis = TestRedis::create().await;
    let center = Center::start_sqlite().await;
    create(&center, "race", 10_000).await;
    let (app, web) = agents(&center, &redis).await;
    let clients = [app.client().await, web.client().await];

    // Each user asks for 4 on both channels at once, each request sent twice (a replay):
    // 8 asked against an allowance of 5.
    let jobs = (0..USERS).flat_map(|u| (0..2).flat_map(move |c| [(u, c), (u, c)]));
    let answers: Vec<(usize, usize, pb::AcquireResponse)> = futures::stream::iter(jobs)
        .map(|(u, c)| {
            let mut client = clients[c].clone();
            async move {
                let user = format!("u{u}");
                let answer = partial(&mut client, "race", &user, 4, &format!("{user}-{c}")).await;
                (u, c, answer)
            }
        })
        .buffer_unordered(128)
        .collect()
        .await;

    let mut by_key: BTreeMap<(usize, usize), (String, u64)> = BTreeMap::new();
    for (u, c, a) in &answers {
        if a.outcome != RESERVED {
            assert_eq!(a.outcome, OVER, "user {u} on channel {c}: {a:?}");
            continue;
        }
        let got = (a.reservation_id.clone(), a.quantity);
        let first = by_key.entry((*u, *c)).or_insert_with(|| got.clone());
        assert_eq!(*first, got, "user {u} on channel {c}: one key, two answers");
    }
    let mut per_user = vec![0u64; USERS];
    for ((u, _), (_, q)) in &by_key {
        per_user[*u] += q;
    }
    // Stock is plenty, so the two keys of a user together take the whole allowance.
    for (u, held) in per_user.iter().enumerate() {
        assert_eq!(*held, LIMIT, "user u{u} holds {held} units over both channels, the limit is {LIMIT}");
    }
    let [mut app, mut web] = clients;
    let reserved = stock(&mut app, "race").await.reserved + stock(&mut web, "race").await.reserved;
    assert_eq!(reserved, LIMIT * USERS as u64, "the pools hold exactly what was answered");
}
