//! Property test: random sequences of ledger operations against the real store and a
//! simple reference model; after every step the two agree and invariant 1 holds.

use std::collections::HashMap;

use inventory_center::error::CenterError;
use inventory_center::store::{self, LedgerStore, NewItem};
use inventory_core::watermarks::Watermarks;
use inventory_core::{AgentId, Channel, ItemId, Quantity, RequestId};
use inventory_test_support::{TestDatabase, TestSqlite};
use proptest::prelude::*;

const CHANNELS: [&str; 3] = ["app", "web", "eu"];
const TOTAL: u64 = 200;

#[derive(Debug, Clone)]
enum Op {
    Borrow { ch: usize, q: u64, rid: u8 },
    Return { ch: usize, q: u64, rid: u8 },
    AddStock { q: u64, rid: u8 },
    Reregister { ch: usize },
}

fn op() -> impl Strategy<Value = Op> {
    // Request ids come from a small space so replays and conflicts happen often.
    prop_oneof![
        4 => (0..3usize, 1..80u64, 0..12u8).prop_map(|(ch, q, rid)| Op::Borrow { ch, q, rid }),
        3 => (0..3usize, 1..60u64, 0..12u8).prop_map(|(ch, q, rid)| Op::Return { ch, q, rid }),
        1 => (1..50u64, 0..4u8).prop_map(|(q, rid)| Op::AddStock { q, rid }),
        1 => (0..3usize).prop_map(|ch| Op::Reregister { ch }),
    ]
}

/// What the ledger should look like.
#[derive(Default)]
struct Model {
    total: u64,
    available: u64,
    held: HashMap<usize, u64>,
    /// (scope, rid) -> (payload, answer)
    seen: HashMap<(String, u8), (String, Answer)>,
}

#[derive(Debug, Clone, PartialEq)]
enum Answer {
    Granted(u64),
    Returned,
    Refused,
    Stocked,
}

impl Model {
    fn apply(&mut self, op: &Op) -> Answer {
        let (scope, rid, payload) = match op {
            Op::Borrow { ch, q, rid } => (format!("ch{ch}"), *rid, format!("b{q}")),
            Op::Return { ch, q, rid } => (format!("ch{ch}"), *rid, format!("r{q}")),
            Op::AddStock { q, rid } => ("admin".into(), *rid, format!("a{q}")),
            Op::Reregister { .. } => return Answer::Stocked,
        };
        if let Some((p, answer)) = self.seen.get(&(scope.clone(), rid)) {
            return if *p == payload { answer.clone() } else { Answer::Refused };
        }
        let answer = match op {
            Op::Borrow { ch, q, .. } => {
                let g = (*q).min(self.available);
                self.available -= g;
                *self.held.entry(*ch).or_default() += g;
                Answer::Granted(g)
            }
            Op::Return { ch, q, .. } => {
                let h = self.held.entry(*ch).or_default();
                if *q > *h {
                    // Refused returns are not remembered: nothing was committed.
                    return Answer::Refused;
                }
                *h -= q;
                self.available += q;
                Answer::Returned
            }
            Op::AddStock { q, .. } => {
                self.total += q;
                self.available += q;
                Answer::Stocked
            }
            Op::Reregister { .. } => unreachable!(),
        };
        self.seen.insert((scope, rid), (payload, answer.clone()));
        answer
    }
}

async fn run(store: &dyn LedgerStore, ops: &[Op]) {
    let item = ItemId::parse("item_id", "m").unwrap();
    let new = NewItem {
        item_id: item.clone(),
        total: Quantity::parse("total", TOTAL).unwrap(),
        per_user_limit: 1,
        reservation_ttl_ms: 1000,
        watermarks: Watermarks::default_for_total(TOTAL),
        rate_batching: None,
        segments: 1,
        limit: Default::default(),
        plan: Default::default(),
        shares: Default::default(),
    };
    store.create_item(&new, 0).await.unwrap();
    let channels: Vec<Channel> = CHANNELS.iter().map(|c| Channel::parse("channel", c).unwrap()).collect();
    let mut epochs = Vec::new();
    for c in &channels {
        epochs.push(
            store.register(c, &AgentId::parse("agent_id", "a").unwrap(), 0, 60_000, 0).await.unwrap().session.epoch,
        );
    }
    let mut model = Model { total: TOTAL, available: TOTAL, ..Default::default() };
    for op in ops {
        let expected = model.apply(op);
        let rid = |r: &u8| RequestId::parse("request_id", &format!("r{r}")).unwrap();
        let actual = match op {
            Op::Borrow { ch, q, rid: r } => {
                match store
                    .borrow(
                        &item,
                        &channels[*ch],
                        epochs[*ch],
                        Quantity::parse("q", *q).unwrap(),
                        &rid(r),
                        Default::default(),
                    )
                    .await
                {
                    Ok(b) => Answer::Granted(b.granted),
                    Err(CenterError::AlreadyExists(_)) => Answer::Refused,
                    Err(e) => panic!("borrow failed: {e}"),
                }
            }
            Op::Return { ch, q, rid: r } => {
                match store
                    .give_back(&item, &channels[*ch], epochs[*ch], Quantity::parse("q", *q).unwrap(), &rid(r))
                    .await
                {
                    Ok(_) => Answer::Returned,
                    Err(CenterError::AlreadyExists(_) | CenterError::Precondition(_)) => Answer::Refused,
                    Err(e) => panic!("return failed: {e}"),
                }
            }
            Op::AddStock { q, rid: r } => {
                match store.add_stock(&item, Quantity::parse("q", *q).unwrap(), &rid(r)).await {
                    Ok(_) => Answer::Stocked,
                    Err(CenterError::AlreadyExists(_)) => Answer::Refused,
                    Err(e) => panic!("add stock failed: {e}"),
                }
            }
            Op::Reregister { ch } => {
                let reg = store
                    .register(&channels[*ch], &AgentId::parse("agent_id", "b").unwrap(), 0, 60_000, 0)
                    .await
                    .unwrap();
                assert!(reg.session.epoch > epochs[*ch]);
                epochs[*ch] = reg.session.epoch;
                let held = reg.held.iter().find(|h| h.item_id == "m").map_or(0, |h| h.held);
                assert_eq!(held, model.held.get(ch).copied().unwrap_or(0), "held at registration");
                Answer::Stocked
            }
        };
        assert_eq!(actual, expected, "after {op:?}");
        let view = store.item_ledger(&item).await.unwrap();
        assert_eq!((view.item.state.total, view.item.state.available), (model.total, model.available), "after {op:?}");
        let held: u64 = view.channels.iter().map(|c| c.allocation.held()).sum();
        assert_eq!(view.item.state.total, view.item.state.available + held, "invariant 1 after {op:?}");
        for c in &view.channels {
            let n = CHANNELS.iter().position(|x| *x == c.channel).unwrap();
            assert_eq!(c.allocation.held(), model.held.get(&n).copied().unwrap_or(0), "{} after {op:?}", c.channel);
        }
    }
    let rec = store.reconcile(None).await.unwrap();
    assert!(rec.check.violations.is_empty(), "{:?}", rec.check.violations);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn sqlite_store_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let db = TestSqlite::create();
            let store = store::connect(&db.url).await.unwrap();
            run(&store, &ops).await;
        });
    }

    #[test]
    fn postgres_store_matches_the_model(ops in prop::collection::vec(op(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let db = TestDatabase::create().await;
            let store = store::connect(&db.url).await.unwrap();
            run(&store, &ops).await;
        });
    }
}
