//! Heartbeat reports and the loss rule, through gRPC, against PostgreSQL and SQLite: a pool
//! reported lost, or with another generation than the one last reported, puts what the
//! channel holds of the item in doubt, in the report's own transaction.

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::transport::Channel;

use crate::contract::{borrow, create, ledger, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    a_lost_or_recreated_pool_puts_its_units_in_doubt,
    the_highest_write_sequence_reported_is_the_floor_handed_back,
    a_returns_write_sequences_raise_the_floors_whatever_it_answers,
    a_report_naming_an_unknown_item_is_refused_whole,
    a_heartbeat_larger_than_a_chunk_stores_every_report,
    a_loss_within_a_large_heartbeat_is_applied_with_its_chunk,
);

async fn report(
    center: &mut CenterClient<Channel>,
    epoch: u64,
    pools: &[(&str, u64, u64, bool)],
) -> pb::HeartbeatResponse {
    let pools = pools
        .iter()
        .map(|&(item, available, generation, lost)| pb::PoolReport {
            item_id: item.into(),
            available,
            generation,
            lost,
            ..Default::default()
        })
        .collect();
    let mut r = center
        .heartbeat(pb::HeartbeatRequest { channel: "app".into(), epoch, pools, ..Default::default() })
        .await
        .expect("heartbeat")
        .into_inner();
    // A set: the order says nothing.
    r.in_doubt_items.sort();
    r
}

async fn a_lost_or_recreated_pool_puts_its_units_in_doubt(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    for item in ["a", "b", "c"] {
        create(&mut admin, item, 100).await;
    }
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 10, "a1").await.unwrap();
    borrow(&mut center, "b", "app", epoch, 4, "b1").await.unwrap();
    let r = report(&mut center, epoch, &[("a", 10, 5, false), ("b", 4, 9, false)]).await;
    assert!(r.in_doubt_items.is_empty(), "{r:?}");

    // a's pool comes back with a new generation, b's is reported lost, c was never held.
    let r = report(&mut center, epoch, &[("a", 0, 6, false), ("b", 0, 9, true), ("c", 0, 0, true)]).await;
    assert_eq!(r.in_doubt_items, ["a", "b"], "only pools whose loss put units in doubt");
    let a = ledger(&mut admin, "a").await.channels[0].clone();
    assert_eq!((a.in_doubt, a.generation, a.reported_available), (10, 6, 0));
    assert_eq!(ledger(&mut admin, "b").await.channels[0].in_doubt, 4);
    assert_eq!(ledger(&mut admin, "c").await.channels[0].in_doubt, 0);

    // The new pool is the one now known: reporting it again loses nothing more; items
    // still in doubt stay listed.
    let r = report(&mut center, epoch, &[("a", 0, 6, false)]).await;
    assert_eq!(r.in_doubt_items, ["a", "b"]);
    assert_eq!(ledger(&mut admin, "a").await.channels[0].in_doubt, 10);
    // A generation of 0 after a real one: the pool vanished.
    admin
        .resolve_in_doubt(pb::ResolveInDoubtRequest { item_id: "a".into(), channel: "app".into(), sold: 0 })
        .await
        .expect("resolve");
    borrow(&mut center, "a", "app", epoch, 3, "a2").await.unwrap();
    report(&mut center, epoch, &[("a", 3, 7, false)]).await;
    let r = report(&mut center, epoch, &[("a", 0, 0, false)]).await;
    assert!(r.in_doubt_items.contains(&"a".to_owned()), "{r:?}");
    assert_eq!(ledger(&mut admin, "a").await.channels[0].in_doubt, 3);
    let rec = admin.reconcile(pb::ReconcileRequest::default()).await.unwrap().into_inner();
    assert!(rec.ok, "{rec:?}");
}

async fn a_report_naming_an_unknown_item_is_refused_whole(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 10, "a1").await.unwrap();
    let pools = ["a", "nope"]
        .iter()
        .map(|item| pb::PoolReport { item_id: (*item).into(), available: 7, generation: 1, ..Default::default() })
        .collect();
    let refused = center
        .heartbeat(pb::HeartbeatRequest { channel: "app".into(), epoch, pools, ..Default::default() })
        .await
        .expect_err("an unknown item");
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused:?}");
    assert!(refused.message().contains("nope"), "{refused:?}");
    // The chunk's other report is not stored either.
    assert_eq!(ledger(&mut admin, "a").await.channels[0].reported_available, 0);
}

async fn a_heartbeat_larger_than_a_chunk_stores_every_report(c: TestCenter) {
    // More pools than one transaction of reports takes (500), of items whose ids sort
    // differently from the order sent: each is stored with its own counts.
    const ITEMS: u64 = 1_203;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let id = |i: u64| format!("i-{:04}", (i * 7) % ITEMS);
    for i in 0..ITEMS {
        create(&mut admin, &id(i), 100).await;
    }
    let epoch = register(&mut center, "app").await;
    let pools: Vec<pb::PoolReport> = (0..ITEMS)
        .map(|i| pb::PoolReport {
            item_id: id(i),
            available: i % 5,
            reserved: i % 3,
            sold: i % 2,
            generation: 1 + i,
            sell_rate_milli: i,
            write_seq: 10 + i,
            ..Default::default()
        })
        .collect();
    center
        .heartbeat(pb::HeartbeatRequest { channel: "app".into(), epoch, pools, ..Default::default() })
        .await
        .expect("heartbeat");
    for i in [0, 1, 499, 500, 777, ITEMS - 1] {
        let line = ledger(&mut admin, &id(i)).await.channels[0].clone();
        let got = (line.reported_available, line.reported_reserved, line.reported_sold, line.generation);
        assert_eq!(got, (i % 5, i % 3, i % 2, 1 + i), "{}", id(i));
        assert_eq!(floors(&mut center, &id(i)).await.1, [10 + i], "{}", id(i));
    }
}

async fn a_loss_within_a_large_heartbeat_is_applied_with_its_chunk(c: TestCenter) {
    // A chunk whose reports touch no units in doubt is read once under the channel lock;
    // one that loses a pool starts over with that item locked. Both kinds in one heartbeat.
    const ITEMS: u64 = 700;
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let id = |i: u64| format!("l-{i:04}");
    for i in 0..ITEMS {
        create(&mut admin, &id(i), 100).await;
    }
    let epoch = register(&mut center, "app").await;
    let lost = 250;
    borrow(&mut center, &id(lost), "app", epoch, 6, "l1").await.unwrap();
    let pools = |round: u64| -> Vec<(String, u64, u64, bool)> {
        (0..ITEMS).map(|i| (id(i), round + i % 4, 1, round == 2 && i == lost)).collect()
    };
    for round in [1, 2] {
        let owned = pools(round);
        let pools: Vec<(&str, u64, u64, bool)> = owned.iter().map(|(i, a, g, l)| (i.as_str(), *a, *g, *l)).collect();
        let r = report(&mut center, epoch, &pools).await;
        let expected: Vec<String> = if round == 2 { vec![id(lost)] } else { Vec::new() };
        assert_eq!(r.in_doubt_items, expected, "round {round}");
    }
    assert_eq!(ledger(&mut admin, &id(lost)).await.channels[0].in_doubt, 6);
    for i in [0, lost - 1, lost + 1, 499, 500, ITEMS - 1] {
        assert_eq!(ledger(&mut admin, &id(i)).await.channels[0].reported_available, 2 + i % 4, "{}", id(i));
    }
}

/// The floors the center hands `channel` for `item`: (registration, DescribeItem).
async fn floors(center: &mut CenterClient<Channel>, item: &str) -> (Vec<u64>, Vec<u64>) {
    let reg = center
        .register_agent(pb::RegisterAgentRequest { channel: "app".into(), agent_id: "app-1".into(), fenced_at: 0 })
        .await
        .expect("register")
        .into_inner();
    let held = reg.held.iter().find(|h| h.item_id == item).map(|h| h.write_seq_floors.clone()).unwrap_or_default();
    let d = center
        .describe_item(pb::DescribeItemRequest { item_id: item.into(), channel: "app".into() })
        .await
        .expect("describe")
        .into_inner();
    (held, d.write_seq_floors)
}

async fn the_highest_write_sequence_reported_is_the_floor_handed_back(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    admin
        .create_item(pb::CreateItemRequest {
            item_id: "s".into(),
            total: 100,
            per_user_limit: 2,
            segments: 3,
            ..Default::default()
        })
        .await
        .expect("create segmented item");
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 10, "a1").await.unwrap();
    borrow(&mut center, "s", "app", epoch, 9, "s1").await.unwrap();
    assert_eq!(floors(&mut center, "a").await, (vec![], vec![]), "nothing reported: no floor");

    let seg = |segment, write_seq| pb::SegmentCounts { segment, available: 3, write_seq, ..Default::default() };
    let send = |center: &mut CenterClient<Channel>, epoch, a_seq, s_seqs: [u64; 3]| {
        let pools = vec![
            pb::PoolReport {
                item_id: "a".into(),
                available: 10,
                generation: 5,
                write_seq: a_seq,
                ..Default::default()
            },
            pb::PoolReport {
                item_id: "s".into(),
                available: 9,
                generation: 6,
                segments: vec![seg(0, s_seqs[0]), seg(1, s_seqs[1]), seg(2, s_seqs[2])],
                ..Default::default()
            },
        ];
        let mut center = center.clone();
        async move {
            center
                .heartbeat(pb::HeartbeatRequest { channel: "app".into(), epoch, pools, ..Default::default() })
                .await
                .expect("heartbeat")
        }
    };
    // (Each look at the floors registered anew.)
    let epoch = register(&mut center, "app").await;
    send(&mut center, epoch, 40, [7, 0, 12]).await;
    let (held, described) = floors(&mut center, "a").await;
    assert_eq!((held, described), (vec![40], vec![40]));
    let (held, described) = floors(&mut center, "s").await;
    assert_eq!((held, described), (vec![7, 0, 12], vec![7, 0, 12]), "per segment; 0 where none is known");

    // A lower sequence (a pool that went back, an agent that restarted without a floor)
    // never lowers what the center remembers; a higher one raises it.
    let epoch = register(&mut center, "app").await;
    send(&mut center, epoch, 12, [9, 4, 1]).await;
    assert_eq!(floors(&mut center, "a").await.1, vec![40]);
    assert_eq!(floors(&mut center, "s").await.1, vec![9, 4, 12]);

    // A sequence the database cannot hold is refused, naming the field.
    let epoch = register(&mut center, "app").await;
    let bad = pb::PoolReport { item_id: "a".into(), write_seq: u64::MAX, ..Default::default() };
    let refused = center
        .heartbeat(pb::HeartbeatRequest { channel: "app".into(), epoch, pools: vec![bad], ..Default::default() })
        .await
        .expect_err("too large");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("pools[0].write_seq"), "{refused:?}");
}

async fn a_returns_write_sequences_raise_the_floors_whatever_it_answers(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    admin
        .create_item(pb::CreateItemRequest { item_id: "s".into(), total: 100, segments: 3, ..Default::default() })
        .await
        .expect("create segmented item");
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 10, "a1").await.unwrap();
    borrow(&mut center, "s", "app", epoch, 9, "s1").await.unwrap();
    let give_back = |item: &str, quantity, request_id: &str, floors: Vec<u64>| pb::ReturnRequest {
        item_id: item.into(),
        channel: "app".into(),
        epoch,
        quantity,
        request_id: request_id.into(),
        write_seq_floors: floors,
    };
    let r = center.r#return(give_back("a", 4, "r1", vec![33])).await.expect("return").into_inner();
    assert_eq!(r.center_available, 94);
    center.r#return(give_back("s", 2, "r2", vec![0, 21, 5])).await.expect("return");
    assert_eq!(floors(&mut center, "a").await, (vec![33], vec![33]), "the Return's floor is handed back");
    assert_eq!(floors(&mut center, "s").await.1, vec![0, 21, 5]);

    // A Return the ledger refuses (more than held) still tells how far the pool got; a
    // lower floor lowers nothing; the refused Return moved no unit.
    let epoch = register(&mut center, "app").await;
    let refused = center
        .r#return(pb::ReturnRequest { epoch, ..give_back("a", 7, "r3", vec![50]) })
        .await
        .expect_err("more than held");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("holds 6"), "{refused:?}");
    center.r#return(pb::ReturnRequest { epoch, ..give_back("s", 1, "r4", vec![9, 3, 6]) }).await.expect("return");
    assert_eq!(floors(&mut center, "a").await.1, vec![50]);
    assert_eq!(floors(&mut center, "s").await.1, vec![9, 21, 6]);
    assert_eq!(ledger(&mut admin, "a").await.channels[0].held, 6);
}
