//! Each channel's calls to the center are rate-limited and its open WatchChannel streams
//! bounded: a flooding channel is refused with RESOURCE_EXHAUSTED naming the rule while
//! another channel is served.

use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_test_support::wait_until;
use tonic::Code;

use crate::contract::{borrow, create, register};
use crate::support::{Backend, TestCenter};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_channel_is_refused_while_another_is_served() {
    let c = TestCenter::start_with(Backend::Sqlite, |cfg| {
        cfg.channel_rate_per_sec = 20;
        cfg.channel_burst = 20;
    })
    .await;
    let mut admin = c.admin().await;
    let mut center = c.center().await;
    create(&mut admin, "i", 1_000).await;
    let app = register(&mut center, "app").await;
    let web = register(&mut center, "web").await;

    // At most 200 calls: the burst of 20 (less the registration) is spent well before.
    let mut refused = None;
    let started = std::time::Instant::now();
    for n in 0..200 {
        match borrow(&mut center, "i", "app", app, 1, &format!("flood-{n}")).await {
            Ok(_) => {}
            Err(s) => {
                refused = Some((n, s));
                break;
            }
        }
    }
    let (n, status) = refused.expect("the flood is refused");
    // The burst, plus what refilled at 20 per second while the calls ran.
    let allowed = 20 + usize::try_from(started.elapsed().as_millis() / 50 + 1).unwrap();
    assert!(n <= allowed, "refused after {n} calls, {allowed} allowed");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("channel app exceeds its call rate")
            && status.message().contains("20 per second")
            && status.message().contains("--channel-rate-per-sec"),
        "{status:?}"
    );
    // web has its own allowance.
    for n in 0..5 {
        let b = borrow(&mut center, "i", "web", web, 1, &format!("web-{n}")).await.expect("web is served");
        assert_eq!(b.granted, 1);
    }
    // And app is served again once its allowance refills (20 per second).
    let served = wait_until(Duration::from_secs(5), || {
        let mut center = center.clone();
        async move { borrow(&mut center, "i", "app", app, 1, "after-the-flood").await.is_ok() }
    })
    .await;
    assert!(served, "app served again after the flood");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_per_channel_are_bounded() {
    let c = TestCenter::start_with(Backend::Sqlite, |cfg| cfg.max_watch_streams_per_channel = 3).await;
    let mut center = c.center().await;
    let app = register(&mut center, "app").await;
    let web = register(&mut center, "web").await;
    let watch = |channel: &str, epoch: u64| pb::WatchChannelRequest { channel: channel.into(), epoch };

    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(center.watch_channel(watch("app", app)).await.expect("within the bound").into_inner());
    }
    let refused = center.watch_channel(watch("app", app)).await.expect_err("the 4th stream");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("channel app has 3 WatchChannel streams open")
            && refused.message().contains("--max-watch-streams-per-channel 3"),
        "{refused:?}"
    );
    // Another channel's streams are counted apart.
    let _web = center.watch_channel(watch("web", web)).await.expect("web's first stream").into_inner();

    // A stream its caller drops frees its place.
    drop(open.pop());
    let reopened = wait_until(Duration::from_secs(5), || {
        let mut center = center.clone();
        async move { center.watch_channel(watch("app", app)).await.is_ok() }
    })
    .await;
    assert!(reopened, "a place freed by a dropped stream is taken again");
}
