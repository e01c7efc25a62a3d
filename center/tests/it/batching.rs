//! BorrowMany (several Borrows of one channel in one call) and group commit (concurrent
//! Borrows and Returns of one item in one transaction), against both backends.

use std::collections::HashMap;

use inventory_proto::v1 as pb;
use inventory_proto::v1::center_client::CenterClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::contract::{assert_conserved, assert_status, borrow, create, give_back, ledger, reconcile, register};
use crate::support::TestCenter;

crate::for_each_backend!(
    borrow_many_answers_each_line_with_its_own_code,
    borrow_many_replayed_whole_answers_every_line_from_its_record,
    borrow_many_with_a_stale_epoch_fails_and_changes_nothing,
    borrow_many_validates_the_whole_call_naming_the_field,
    concurrent_borrows_and_returns_of_one_item_are_each_answered_once,
);

fn line(item: &str, quantity: u64, request_id: &str) -> pb::BorrowLine {
    pb::BorrowLine { item_id: item.into(), quantity, request_id: request_id.into(), sell_rate_milli: 0 }
}

async fn borrow_many(
    center: &mut CenterClient<Channel>,
    channel: &str,
    epoch: u64,
    lines: Vec<pb::BorrowLine>,
) -> Result<Vec<pb::BorrowLineResult>, tonic::Status> {
    center
        .borrow_many(pb::BorrowManyRequest { channel: channel.into(), epoch, lines })
        .await
        .map(|r| r.into_inner().results)
}

async fn borrow_many_answers_each_line_with_its_own_code(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    create(&mut admin, "b", 5).await;
    let epoch = register(&mut center, "app").await;
    let first = borrow(&mut center, "a", "app", epoch, 10, "single-1").await.unwrap();
    let results = borrow_many(
        &mut center,
        "app",
        epoch,
        vec![
            line("a", 20, "m-1"),
            line("b", 8, "m-2"),
            line("nope", 1, "m-3"),
            line("a", 11, "single-1"),
            line("a", 10, "single-1"),
            line("a", 5, "m-1"),
            line("a", 20, "m-1"),
        ],
    )
    .await
    .expect("borrow many");
    assert_eq!(results.len(), 7);
    let codes: Vec<i32> = results.iter().map(|r| r.code).collect();
    let ok = Code::Ok as i32;
    assert_eq!(
        codes,
        vec![ok, ok, Code::NotFound as i32, Code::AlreadyExists as i32, ok, Code::AlreadyExists as i32, ok]
    );
    assert_eq!((results[0].granted, results[0].center_available, results[0].replayed), (20, 70, false));
    // Short: all that is left.
    assert_eq!((results[1].granted, results[1].center_available), (5, 0));
    assert!(results[2].message.contains("nope"), "{:?}", results[2]);
    assert!(results[3].message.contains("single-1"), "{:?}", results[3]);
    // A replay of a single Borrow: its first answer.
    assert!(results[4].replayed);
    assert_eq!((results[4].granted, results[4].center_available), (first.granted, first.center_available));
    // The same id twice in one call: the second is a replay of the first.
    assert!(results[6].replayed);
    assert_eq!((results[6].granted, results[6].center_available), (20, 70));
    for (r, id) in results.iter().zip(["m-1", "m-2", "m-3", "single-1", "single-1", "m-1", "m-1"]) {
        assert_eq!(r.request_id, id);
    }
    let a = ledger(&mut admin, "a").await;
    assert_eq!((a.item.as_ref().unwrap().available, a.channels[0].granted), (70, 30));
    assert_conserved(&a);
    let b = ledger(&mut admin, "b").await;
    assert_eq!(b.item.as_ref().unwrap().available, 0);
    assert_conserved(&b);
    assert!(reconcile(&mut admin).await.ok);
}

async fn borrow_many_replayed_whole_answers_every_line_from_its_record(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    let items: Vec<String> = (0..40).map(|n| format!("item-{n}")).collect();
    for item in &items {
        create(&mut admin, item, 50).await;
    }
    let epoch = register(&mut center, "app").await;
    let lines: Vec<pb::BorrowLine> = items.iter().map(|i| line(i, 30, &format!("r-{i}"))).collect();
    let first = borrow_many(&mut center, "app", epoch, lines.clone()).await.expect("first");
    assert!(first.iter().all(|r| r.code == 0 && r.granted == 30 && r.center_available == 20 && !r.replayed));
    // Stock moves meanwhile; the replay still answers what the first call got.
    borrow(&mut center, "item-0", "app", epoch, 20, "other").await.unwrap();
    let again = borrow_many(&mut center, "app", epoch, lines).await.expect("replay");
    for (a, b) in first.iter().zip(&again) {
        assert!(b.replayed, "{b:?}");
        assert_eq!((a.granted, a.center_available), (b.granted, b.center_available));
    }
    // Each line one by one is a replay too.
    let single = borrow(&mut center, "item-3", "app", epoch, 30, "r-item-3").await.unwrap();
    assert!(single.replayed);
    assert_eq!(ledger(&mut admin, "item-0").await.channels[0].granted, 50);
    assert_eq!(ledger(&mut admin, "item-39").await.channels[0].granted, 30);
}

async fn borrow_many_with_a_stale_epoch_fails_and_changes_nothing(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    let old = register(&mut center, "app").await;
    let new = register(&mut center, "app").await;
    assert!(new > old);
    let stale = borrow_many(&mut center, "app", old, vec![line("a", 5, "s-1"), line("a", 5, "s-2")]).await;
    assert_status(stale, Code::FailedPrecondition, "stale epoch");
    let unknown = borrow_many(&mut center, "web", 1, vec![line("a", 5, "w-1")]).await;
    assert_status(unknown, Code::FailedPrecondition, "not registered");
    let view = ledger(&mut admin, "a").await;
    assert_eq!(view.item.as_ref().unwrap().available, 100);
    // The refused ids were not recorded: the current epoch applies them.
    let ok = borrow_many(&mut center, "app", new, vec![line("a", 5, "s-1")]).await.unwrap();
    assert_eq!((ok[0].code, ok[0].granted, ok[0].replayed), (0, 5, false));
}

async fn borrow_many_validates_the_whole_call_naming_the_field(c: TestCenter) {
    let (mut admin, mut center) = (c.admin().await, c.center().await);
    create(&mut admin, "a", 100).await;
    let epoch = register(&mut center, "app").await;
    assert_status(borrow_many(&mut center, "app", epoch, vec![]).await, Code::InvalidArgument, "lines");
    let zero = vec![line("a", 1, "v-1"), line("a", 0, "v-2")];
    assert_status(borrow_many(&mut center, "app", epoch, zero).await, Code::InvalidArgument, "lines[1].quantity");
    let bad_id = vec![line("a", 1, "v-1"), line("a", 1, "v-2"), line("a b", 1, "v-3")];
    assert_status(borrow_many(&mut center, "app", epoch, bad_id).await, Code::InvalidArgument, "lines[2].item_id");
    let no_rid = vec![line("a", 1, "")];
    assert_status(borrow_many(&mut center, "app", epoch, no_rid).await, Code::InvalidArgument, "lines[0].request_id");
    let many: Vec<pb::BorrowLine> =
        (0..=inventory_core::ledger::MAX_BORROW_LINES).map(|n| line("a", 1, &format!("x-{n}"))).collect();
    assert_status(borrow_many(&mut center, "app", epoch, many).await, Code::InvalidArgument, "lines");
    assert_status(
        borrow_many(&mut center, "bad channel", epoch, vec![line("a", 1, "v")]).await,
        Code::InvalidArgument,
        "channel",
    );
    // Nothing moved.
    assert_eq!(ledger(&mut admin, "a").await.item.unwrap().available, 100);
}

/// 50 callers on one item, Borrows and Returns mixed, every tenth call a replay of the
/// caller's previous one: each call answered once, replays with their first answer, and
/// the ledger conserved throughout and at the end.
async fn concurrent_borrows_and_returns_of_one_item_are_each_answered_once(c: TestCenter) {
    const CALLERS: usize = 50;
    const CALLS: usize = 30;
    let mut admin = c.admin().await;
    create(&mut admin, "hot", 1_000_000).await;
    let epochs = [register(&mut c.center().await, "ch0").await, register(&mut c.center().await, "ch1").await];
    let (batches_before, calls_before) = c.store.group_commits();
    let mut tasks = Vec::new();
    for t in 0..CALLERS {
        let mut center = c.center().await;
        let (channel, epoch) = (format!("ch{}", t % 2), epochs[t % 2]);
        tasks.push(tokio::spawn(async move {
            let mut answers: HashMap<String, (u64, u64)> = HashMap::new();
            let (mut borrowed, mut returned) = (0u64, 0u64);
            let mut last: Option<(String, u64, bool)> = None;
            for n in 0..CALLS {
                if n % 10 == 9 {
                    let (rid, quantity, is_borrow) = last.clone().expect("a call before");
                    let got = if is_borrow {
                        let b = borrow(&mut center, "hot", &channel, epoch, quantity, &rid).await.expect("replay");
                        assert!(b.replayed, "{b:?}");
                        (b.granted, b.center_available)
                    } else {
                        let r = give_back(&mut center, "hot", &channel, epoch, quantity, &rid).await.expect("replay");
                        assert!(r.replayed, "{r:?}");
                        (0, r.center_available)
                    };
                    assert_eq!(answers[&rid], got, "replay of {rid} answered differently");
                    continue;
                }
                let rid = format!("t{t}-{n}");
                if n % 3 == 2 && borrowed > returned {
                    let quantity = 1.max((borrowed - returned) / 2);
                    let r = give_back(&mut center, "hot", &channel, epoch, quantity, &rid).await.expect("return");
                    assert!(!r.replayed);
                    returned += quantity;
                    answers.insert(rid.clone(), (0, r.center_available));
                    last = Some((rid, quantity, false));
                } else {
                    let quantity = 1 + (n as u64 % 7);
                    let b = borrow(&mut center, "hot", &channel, epoch, quantity, &rid).await.expect("borrow");
                    assert!(!b.replayed);
                    assert_eq!(b.granted, quantity);
                    borrowed += b.granted;
                    answers.insert(rid.clone(), (b.granted, b.center_available));
                    last = Some((rid, quantity, true));
                }
            }
            (borrowed, returned)
        }));
    }
    let (mut borrowed, mut returned) = (0u64, 0u64);
    for task in tasks {
        let (b, r) = task.await.expect("caller");
        borrowed += b;
        returned += r;
    }
    let view = ledger(&mut admin, "hot").await;
    let item = view.item.clone().unwrap();
    assert_eq!(item.available, 1_000_000 - borrowed + returned);
    assert_eq!(view.channels.iter().map(|c| c.granted).sum::<u64>(), borrowed);
    assert_eq!(view.channels.iter().map(|c| c.returned).sum::<u64>(), returned);
    assert_conserved(&view);
    assert!(reconcile(&mut admin).await.ok);
    // Group commit: the calls shared transactions.
    let (batches, calls) = c.store.group_commits();
    let (batches, calls) = (batches - batches_before, calls - calls_before);
    assert_eq!(calls, (CALLERS * CALLS) as u64, "every call went through group commit once");
    assert!(batches < calls, "{calls} calls in {batches} transactions");
}
