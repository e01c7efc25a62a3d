//! ReturnMany (several Returns of one channel in one call), against both backends: each
//! line answered as its Return would be, replays, a line's bad input answered alone, the
//! epoch fence, the floors raised, and ReturnMany racing BorrowMany over shared items.

use std::collections::HashMap;
use std::time::Duration;

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{assert_conserved, assert_status, borrow, create, give_back, ledger, reconcile, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    return_many_answers_each_line_as_its_return_would,
    return_many_answers_a_line_with_bad_input_alone_naming_field_and_value,
    return_many_replayed_answers_every_line_from_its_record,
    return_many_with_a_stale_epoch_fails_and_changes_nothing,
    return_many_validates_the_whole_call_naming_the_field,
    return_many_raises_the_floors_of_every_line,
    return_many_and_borrow_many_racing_on_shared_items_keep_the_ledger,
);

fn line(item: &str, quantity: u64, request_id: &str) -> pb::ReturnLine {
    pb::ReturnLine { item_id: item.into(), quantity, request_id: request_id.into(), write_seq_floors: vec![] }
}

async fn return_many(
    center: &mut CenterClient<Channel>,
    channel: &str,
    epoch: u64,
    lines: Vec<pb::ReturnLine>,
) -> Result<Vec<pb::ReturnLineResult>, tonic::Status> {
    center
        .return_many(pb::ReturnManyRequest { channel: channel.into(), epoch, lines })
        .await
        .map(|r| r.into_inner().results)
}

fn codes(results: &[pb::ReturnLineResult]) -> Vec<Code> {
    results.iter().map(|r| Code::from_i32(r.code)).collect()
}

/// The same Returns on twin items, once as one ReturnMany and once as single Returns:
/// the same answers, the same ledgers; and the channels watching hear of the stock.
async fn return_many_answers_each_line_as_its_return_would(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    for twin in ["many", "single"] {
        for (item, total) in [("a", 100), ("b", 50), ("c", 10)] {
            create(&mut admin, &format!("{item}-{twin}"), total).await;
        }
    }
    let epoch = register(&mut center, "app").await;
    let web = register(&mut center, "web").await;
    let mut events =
        center.watch_channel(pb::WatchChannelRequest { channel: "web".into(), epoch: web }).await.unwrap().into_inner();
    for twin in ["many", "single"] {
        for (item, quantity) in [("a", 30), ("b", 20), ("c", 10)] {
            borrow(&mut center, &format!("{item}-{twin}"), "app", epoch, quantity, &format!("b-{item}-{twin}"))
                .await
                .unwrap();
        }
    }
    // In order: each line sees what the lines before it left (c: 10 held, 6 then 5 asked).
    let plan = [("a", 10), ("b", 20), ("a", 5), ("c", 6), ("c", 5), ("nope", 1)];
    let id = |n: usize, twin: &str| format!("r-{n}-{twin}");
    let lines =
        plan.iter().enumerate().map(|(n, (item, q))| line(&format!("{item}-many"), *q, &id(n, "many"))).collect();
    let many = return_many(&mut center, "app", epoch, lines).await.expect("return many");
    assert_eq!(many.len(), plan.len());
    let mut single = Vec::new();
    for (n, (item, q)) in plan.iter().enumerate() {
        single.push(give_back(&mut center, &format!("{item}-single"), "app", epoch, *q, &id(n, "single")).await);
    }
    for (n, (m, s)) in many.iter().zip(&single).enumerate() {
        assert_eq!(
            (m.request_id.as_str(), m.item_id.as_str()),
            (id(n, "many").as_str(), &*format!("{}-many", plan[n].0))
        );
        match s {
            Ok(s) => {
                assert_eq!(Code::from_i32(m.code), Code::Ok, "line {n}: {m:?}");
                assert_eq!((m.center_available, m.replayed), (s.center_available, false), "line {n}");
            }
            Err(s) => {
                assert_eq!(Code::from_i32(m.code), s.code(), "line {n}: {m:?}");
                assert_eq!(m.message.replace("-many", ""), s.message().replace("-single", ""), "line {n}");
            }
        }
    }
    assert_eq!(codes(&many), [Code::Ok, Code::Ok, Code::Ok, Code::Ok, Code::FailedPrecondition, Code::NotFound]);
    assert_eq!(many.iter().map(|r| r.center_available).take(4).collect::<Vec<_>>(), [80, 50, 85, 6]);
    for item in ["a", "b", "c"] {
        let (m, s) =
            (ledger(&mut admin, &format!("{item}-many")).await, ledger(&mut admin, &format!("{item}-single")).await);
        assert_eq!(m.item.as_ref().unwrap().available, s.item.as_ref().unwrap().available, "{item}");
        let (mc, sc) = (&m.channels[0], &s.channels[0]);
        assert_eq!((mc.granted, mc.returned, mc.held), (sc.granted, sc.returned, sc.held), "{item}");
        assert_conserved(&m);
    }
    assert!(reconcile(&mut admin).await.ok);
    // Every applied line tells the other channels the center has stock again.
    let mut restocked = Vec::new();
    while restocked.len() < 8 {
        let e =
            tokio::time::timeout(Duration::from_secs(10), events.message()).await.expect("an event").unwrap().unwrap();
        if let Some(pb::channel_event::Event::Restocked(r)) = e.event {
            restocked.push(r.item_id);
        }
    }
    for item in ["a-many", "b-many", "c-many"] {
        assert!(restocked.iter().any(|r| r == item), "{item} restocked: {restocked:?}");
    }
}

/// What Return refuses for its own input refuses that line alone, naming the line's field
/// and value; the other lines apply, and a refused line left no record.
async fn return_many_answers_a_line_with_bad_input_alone_naming_field_and_value(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 50, "b-1").await.unwrap();
    let floors = |floors: Vec<u64>, rid: &str| pb::ReturnLine { write_seq_floors: floors, ..line("a", 1, rid) };
    // A request id made in 1970 (a UUID v7's time): older than records are kept.
    let old_id = format!("{:012x}7000{}", 1, "8000000000000000");
    let lines = vec![
        line("a", 5, "v-0"),
        line("a", 0, "v-1"),
        line("a b", 1, "v-2"),
        line("a", 1, ""),
        floors(vec![3; 65], "v-4"),
        floors(vec![3, u64::MAX], "v-5"),
        line("a", 1, &old_id),
        line("a", 5, "v-7"),
    ];
    let results = return_many(&mut center, "app", epoch, lines).await.expect("return many");
    let invalid = Code::InvalidArgument;
    assert_eq!(
        codes(&results),
        [Code::Ok, invalid, invalid, invalid, invalid, invalid, Code::FailedPrecondition, Code::Ok]
    );
    let named = |n: usize, field: &str, value: &str| {
        let m = &results[n].message;
        assert!(m.contains(field) && m.contains(value), "line {n}: {m:?} should name {field} and {value}");
    };
    named(1, "lines[1].quantity", "0");
    named(2, "lines[2].item_id", "\"a b\"");
    named(3, "lines[3].request_id", "\"\"");
    named(4, "lines[4].write_seq_floors", "65");
    named(5, "lines[5].write_seq_floors[1]", &u64::MAX.to_string());
    named(6, &old_id, "--request-max-age-ms");
    assert_eq!((results[2].item_id.as_str(), results[3].request_id.as_str()), ("a b", ""), "lines echo what was sent");
    assert_eq!((results[0].center_available, results[7].center_available), (55, 60));
    let view = ledger(&mut admin, "a").await;
    assert_eq!((view.item.as_ref().unwrap().available, view.channels[0].returned), (60, 10));
    assert_conserved(&view);
    // The refused lines were not recorded: sent again with valid input they apply.
    let again = return_many(&mut center, "app", epoch, vec![line("a", 1, "v-1"), line("a", 1, "v-2")]).await.unwrap();
    assert!(again.iter().all(|r| r.code == 0 && !r.replayed), "{again:?}");
    assert_eq!(again[1].center_available, 62);
}

async fn return_many_replayed_answers_every_line_from_its_record(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let items: Vec<String> = (0..40).map(|n| format!("item-{n}")).collect();
    for item in &items {
        create(&mut admin, item, 50).await;
    }
    let epoch = register(&mut center, "app").await;
    for item in &items {
        borrow(&mut center, item, "app", epoch, 30, &format!("b-{item}")).await.unwrap();
    }
    let lines: Vec<pb::ReturnLine> = items.iter().map(|i| line(i, 10, &format!("r-{i}"))).collect();
    let first = return_many(&mut center, "app", epoch, lines.clone()).await.expect("first");
    assert!(first.iter().all(|r| r.code == 0 && r.center_available == 30 && !r.replayed), "{first:?}");
    // Stock moves meanwhile; the replay still answers what the first call got.
    give_back(&mut center, "item-0", "app", epoch, 5, "other").await.unwrap();
    let again = return_many(&mut center, "app", epoch, lines).await.expect("replay");
    for (a, b) in first.iter().zip(&again) {
        assert!(b.replayed && b.code == 0, "{b:?}");
        assert_eq!(a.center_available, b.center_available);
    }
    // A line one by one is a replay too, and a single Return's id in a ReturnMany line.
    let single = give_back(&mut center, "item-3", "app", epoch, 10, "r-item-3").await.unwrap();
    assert!(single.replayed && single.center_available == 30);
    let mixed = return_many(
        &mut center,
        "app",
        epoch,
        vec![
            line("item-0", 5, "other"),
            line("item-1", 3, "r-item-1"),
            line("item-2", 2, "twice"),
            line("item-2", 2, "twice"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(codes(&mixed), [Code::Ok, Code::AlreadyExists, Code::Ok, Code::Ok]);
    assert!(mixed[0].replayed && mixed[0].center_available == 35, "{:?}", mixed[0]);
    assert!(mixed[1].message.contains("r-item-1"), "{:?}", mixed[1]);
    // The same id twice in one call: the second line is a replay of the first.
    assert_eq!((mixed[2].replayed, mixed[3].replayed), (false, true));
    assert_eq!((mixed[2].center_available, mixed[3].center_available), (32, 32));
    // Nothing applied twice.
    let view = ledger(&mut admin, "item-0").await;
    assert_eq!((view.channels[0].returned, view.item.as_ref().unwrap().available), (15, 35));
    assert_eq!(ledger(&mut admin, "item-1").await.channels[0].returned, 10);
    assert_eq!(ledger(&mut admin, "item-2").await.channels[0].returned, 12);
    assert_eq!(ledger(&mut admin, "item-39").await.channels[0].returned, 10);
    assert!(reconcile(&mut admin).await.ok);
}

async fn return_many_with_a_stale_epoch_fails_and_changes_nothing(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    let old = register(&mut center, "app").await;
    let new = register(&mut center, "app").await;
    assert!(new > old);
    borrow(&mut center, "a", "app", new, 20, "b-1").await.unwrap();
    let stale = return_many(&mut center, "app", old, vec![line("a", 5, "s-1"), line("a", 5, "s-2")]).await;
    assert_status(stale, Code::FailedPrecondition, "stale epoch");
    let unknown = return_many(&mut center, "web", 1, vec![line("a", 5, "w-1")]).await;
    assert_status(unknown, Code::FailedPrecondition, "not registered");
    let view = ledger(&mut admin, "a").await;
    assert_eq!((view.item.as_ref().unwrap().available, view.channels[0].returned), (80, 0));
    // The refused ids were not recorded: the current epoch applies them.
    let ok = return_many(&mut center, "app", new, vec![line("a", 5, "s-1")]).await.unwrap();
    assert_eq!((ok[0].code, ok[0].center_available, ok[0].replayed), (0, 85, false));
}

async fn return_many_validates_the_whole_call_naming_the_field(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    let epoch = register(&mut center, "app").await;
    borrow(&mut center, "a", "app", epoch, 10, "b-1").await.unwrap();
    assert_status(return_many(&mut center, "app", epoch, vec![]).await, Code::InvalidArgument, "lines");
    let many: Vec<pb::ReturnLine> =
        (0..=inventory_core::ledger::MAX_RETURN_LINES).map(|n| line("a", 1, &format!("x-{n}"))).collect();
    assert_status(return_many(&mut center, "app", epoch, many).await, Code::InvalidArgument, "501");
    assert_status(
        return_many(&mut center, "bad channel", epoch, vec![line("a", 1, "v")]).await,
        Code::InvalidArgument,
        "channel",
    );
    // Nothing moved.
    assert_eq!(ledger(&mut admin, "a").await.item.unwrap().available, 90);
}

/// Each line raises its pool's floors before it applies, as a Return does: whatever the
/// line answers, and never lowering one.
async fn return_many_raises_the_floors_of_every_line(c: TestCenter) {
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
    let with = |item: &str, quantity, rid: &str, floors: Vec<u64>| pb::ReturnLine {
        write_seq_floors: floors,
        ..line(item, quantity, rid)
    };
    let lines = vec![
        with("a", 1, "r-1", vec![40]),
        with("s", 1, "r-2", vec![7, 0, 12]),
        // The same pool twice: the higher floor stays.
        with("a", 1, "r-3", vec![45]),
        // Refused (more than held), yet the pool got that far.
        with("s", 50, "r-4", vec![8]),
    ];
    let results = return_many(&mut center, "app", epoch, lines).await.expect("return many");
    assert_eq!(codes(&results), [Code::Ok, Code::Ok, Code::Ok, Code::FailedPrecondition]);
    assert_eq!(floors(&mut center, "a").await, vec![45]);
    assert_eq!(floors(&mut center, "s").await, vec![8, 0, 12]);
    let lower = return_many(&mut center, "app", epoch, vec![with("a", 1, "r-5", vec![3])]).await.unwrap();
    assert_eq!(lower[0].code, 0);
    assert_eq!(floors(&mut center, "a").await, vec![45], "never lowered");
}

async fn floors(center: &mut CenterClient<Channel>, item: &str) -> Vec<u64> {
    let d = pb::DescribeItemRequest { item_id: item.into(), channel: "app".into() };
    center.describe_item(d).await.expect("describe").into_inner().write_seq_floors
}

/// Tasks on several channels borrow (BorrowMany) and give back (ReturnMany) the same items,
/// each call's lines in another order, some calls replayed: every call answered (no
/// deadlock), replays answer their first answer, and no unit is lost or counted twice.
async fn return_many_and_borrow_many_racing_on_shared_items_keep_the_ledger(c: TestCenter) {
    const ITEMS: usize = 12;
    const TASKS: usize = 8;
    const ROUNDS: usize = 12;
    const TOTAL: u64 = 100_000;
    let mut admin = c.admin().await;
    let items: Vec<String> = (0..ITEMS).map(|i| format!("shared-{i:02}")).collect();
    for item in &items {
        create(&mut admin, item, TOTAL).await;
    }
    let mut epochs = Vec::new();
    for ch in 0..TASKS / 2 {
        epochs.push(register(&mut c.center().await, &format!("ch{ch}")).await);
    }
    let bound = Duration::from_secs(60);
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let mut center = c.center().await;
        let (channel, epoch) = (format!("ch{}", t % (TASKS / 2)), epochs[t % (TASKS / 2)]);
        let items = items.clone();
        tasks.push(tokio::spawn(async move {
            // What this task holds of each item, and borrowed and returned in all.
            let mut held: HashMap<String, u64> = HashMap::new();
            let (mut borrowed, mut returned) = (0u64, 0u64);
            for round in 0..ROUNDS {
                // Another order each task and round: the store must lock in one order.
                let mut order = items.clone();
                order.rotate_left((t * 5 + round * 7) % ITEMS);
                if t % 2 == 1 {
                    order.reverse();
                }
                let lines: Vec<pb::BorrowLine> = order
                    .iter()
                    .enumerate()
                    .map(|(n, item)| pb::BorrowLine {
                        item_id: item.clone(),
                        quantity: 1 + ((t + n + round) % 9) as u64,
                        request_id: format!("b-{t}-{round}-{n}"),
                        sell_rate_milli: 0,
                    })
                    .collect();
                let req = pb::BorrowManyRequest { channel: channel.clone(), epoch, lines: lines.clone() };
                let answer = tokio::time::timeout(bound, center.borrow_many(req)).await.expect("borrow many answered");
                for (l, r) in lines.iter().zip(answer.expect("borrow many").into_inner().results) {
                    assert_eq!((r.code, r.granted), (0, l.quantity), "{r:?}");
                    *held.entry(l.item_id.clone()).or_default() += r.granted;
                    borrowed += r.granted;
                }
                order.rotate_left(3);
                let lines: Vec<pb::ReturnLine> = order
                    .iter()
                    .enumerate()
                    .filter(|(_, item)| held[*item] > 0)
                    .map(|(n, item)| line(item, 1.max(held[item] / 2), &format!("r-{t}-{round}-{n}")))
                    .collect();
                let req = pb::ReturnManyRequest { channel: channel.clone(), epoch, lines: lines.clone() };
                let answer = tokio::time::timeout(bound, center.return_many(req.clone())).await.expect("answered");
                let first = answer.expect("return many").into_inner().results;
                for (l, r) in lines.iter().zip(&first) {
                    assert_eq!((r.code, r.replayed), (0, false), "{r:?}");
                    *held.get_mut(&l.item_id).unwrap() -= l.quantity;
                    returned += l.quantity;
                }
                if round % 4 == 3 {
                    let again = tokio::time::timeout(bound, center.return_many(req)).await.expect("replay answered");
                    for (a, b) in first.iter().zip(again.expect("replay").into_inner().results) {
                        assert!(b.replayed && b.code == 0, "{b:?}");
                        assert_eq!(a.center_available, b.center_available, "a replay answers the first answer");
                    }
                }
            }
            (borrowed, returned)
        }));
    }
    let (mut borrowed, mut returned) = (0u64, 0u64);
    for task in tasks {
        let (b, r) = task.await.expect("task");
        borrowed += b;
        returned += r;
    }
    let (mut granted_seen, mut returned_seen, mut available) = (0u64, 0u64, 0u64);
    for item in &items {
        let view = ledger(&mut admin, item).await;
        assert_conserved(&view);
        granted_seen += view.channels.iter().map(|c| c.granted).sum::<u64>();
        returned_seen += view.channels.iter().map(|c| c.returned).sum::<u64>();
        available += view.item.as_ref().unwrap().available;
    }
    assert_eq!((granted_seen, returned_seen), (borrowed, returned));
    assert_eq!(available, TOTAL * ITEMS as u64 - borrowed + returned);
    assert!(reconcile(&mut admin).await.ok);
}
