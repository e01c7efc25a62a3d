//! The Acquire workload: who buys (a skewed user population), which idempotency key
//! (fresh, or a replay of one this caller used before), and the outcome check: units
//! reserved (distinct reservation ids × quantity) never exceed the stock, and a key that
//! reserved gets the same reservation on every replay.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use inventory_agent::store::redis::RedisPoolStore;
use inventory_agent::store::{AcquireArgs, AcquireResult, PoolKey, PoolStore};
use inventory_proto::v1 as pb;
use inventory_proto::v1::agent_client::AgentClient;
use prost::Message;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tonic::transport::Channel;

use crate::light;
use crate::load::{Caller, Class};
use crate::skew::UserSampler;

/// Deadline of one call; the agent answers in milliseconds or not at all.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Keys a caller remembers for replays.
const RECENT_KEYS: usize = 1_024;

/// What every caller of one Acquire run shares.
#[derive(Debug)]
pub struct Workload {
    pub item: String,
    pub quantity: u64,
    pub users: Arc<UserSampler>,
    /// Share of calls that replay a key this caller used before (0..=1).
    pub replay_share: f64,
    /// Prefix of every idempotency key of the run, so runs never collide.
    pub run_id: String,
    pub seed: u64,
    /// `Bearer <token>` for agents that require a backend token.
    pub authorization: Option<tonic::metadata::AsciiMetadataValue>,
}

/// Where Acquire goes: an agent over gRPC (tonic, or the light client), or the pool store
/// straight (one EVALSHA).
#[derive(Clone)]
pub enum Target {
    Agent(AgentClient<Channel>),
    /// Through the client crate (`--via client`): its retry loop, replica choice and
    /// generation rule on every call.
    Client(inventory_client::AgentClient),
    Light {
        conn: light::Conn,
        uri: http::Uri,
        template: light::AcquireTemplate,
        authorization: Option<http::HeaderValue>,
    },
    /// `pool` names the item's segment 0; with `segments` > 1 the user id picks the
    /// segment, as the agent routes.
    Store {
        store: Arc<RedisPoolStore>,
        pool: PoolKey,
        segments: u32,
        per_user_limit: u64,
        reservation_ttl_ms: u64,
    },
}

/// One caller's bookkeeping.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Key sequence number -> the reservation it got.
    reserved_by_key: HashMap<u64, Box<str>>,
    pub reserved_answers: u64,
    pub replayed_answers: u64,
    pub sold_out: u64,
    pub limit_exceeded: u64,
    /// A replay that came back with another reservation than the key's first one.
    pub replay_mismatches: u64,
    pub errors: BTreeMap<String, u64>,
}

pub struct AcquireCaller {
    index: usize,
    target: Target,
    workload: Arc<Workload>,
    rng: SmallRng,
    next_seq: u64,
    /// (key sequence number, user index) of recent calls, for replays.
    recent: Vec<(u64, u64)>,
    pub ledger: Ledger,
}

impl AcquireCaller {
    pub fn new(index: usize, target: Target, workload: Arc<Workload>) -> Self {
        let rng = SmallRng::seed_from_u64(workload.seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        Self { index, target, workload, rng, next_seq: 0, recent: Vec::new(), ledger: Ledger::default() }
    }

    /// Picks the next (key, user): a replay of a recent key, or a fresh key.
    fn next_request(&mut self) -> (u64, u64) {
        if !self.recent.is_empty() && self.rng.random_bool(self.workload.replay_share) {
            return self.recent[self.rng.random_range(0..self.recent.len())];
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let user = self.workload.users.sample(&mut self.rng);
        if self.recent.len() < RECENT_KEYS {
            self.recent.push((seq, user));
        } else {
            // Below RECENT_KEYS, so it fits.
            let slot = usize::try_from(seq % RECENT_KEYS as u64).unwrap_or_default();
            self.recent[slot] = (seq, user);
        }
        (seq, user)
    }

    fn key(&self, seq: u64) -> String {
        format!("{}-{}-{seq}", self.workload.run_id, self.index)
    }

    fn record_reserved(&mut self, seq: u64, reservation_id: String, replayed: bool) {
        self.ledger.reserved_answers += 1;
        if replayed {
            self.ledger.replayed_answers += 1;
        }
        match self.ledger.reserved_by_key.get(&seq) {
            Some(first) if **first != *reservation_id => self.ledger.replay_mismatches += 1,
            Some(_) => {}
            None => {
                self.ledger.reserved_by_key.insert(seq, reservation_id.into_boxed_str());
            }
        }
    }

    /// An agent's answer, counted and checked.
    fn record_answer(&mut self, seq: u64, answer: pb::AcquireResponse) -> Class {
        match pb::AcquireOutcome::try_from(answer.outcome) {
            Ok(pb::AcquireOutcome::Reserved) => {
                self.record_reserved(seq, answer.reservation_id, answer.replayed);
                Class::Ok
            }
            Ok(pb::AcquireOutcome::SoldOut) => {
                self.ledger.sold_out += 1;
                Class::SoldOut
            }
            Ok(pb::AcquireOutcome::LimitExceeded) => {
                self.ledger.limit_exceeded += 1;
                Class::LimitExceeded
            }
            _ => self.record_error(format!("unknown outcome {}", answer.outcome)),
        }
    }

    fn record_error(&mut self, what: String) -> Class {
        *self.ledger.errors.entry(what).or_default() += 1;
        Class::Error
    }

    /// A caller of `workload`'s Acquire through the light client on `conn`.
    pub fn light(index: usize, conn: light::Conn, workload: Arc<Workload>) -> anyhow::Result<Self> {
        let authorization = match &workload.authorization {
            Some(a) => Some(http::HeaderValue::from_bytes(a.as_encoded_bytes())?),
            None => None,
        };
        let target = Target::Light {
            uri: conn.uri(light::ACQUIRE_PATH)?,
            conn,
            template: light::AcquireTemplate::new(&workload.item, workload.quantity),
            authorization,
        };
        Ok(Self::new(index, target, workload))
    }

    pub fn into_ledger(self) -> Ledger {
        self.ledger
    }
}

impl Caller for AcquireCaller {
    async fn call(&mut self) -> Class {
        let (seq, user) = self.next_request();
        let key = self.key(seq);
        let user_id = format!("u{user}");
        let quantity = self.workload.quantity;
        match &mut self.target {
            Target::Light { conn, uri, template, authorization } => {
                let frame = template.frame(&user_id, &key);
                let call = conn.unary(uri, frame, authorization.as_ref());
                let answer = match tokio::time::timeout(CALL_TIMEOUT, call).await {
                    Ok(Ok(message)) => pb::AcquireResponse::decode(message),
                    Ok(Err(what)) => return self.record_error(what),
                    Err(_) => return self.record_error("client timeout".to_owned()),
                };
                match answer {
                    Ok(answer) => self.record_answer(seq, answer),
                    Err(e) => self.record_error(format!("undecodable answer: {e}")),
                }
            }
            Target::Agent(client) => {
                let mut client = client.clone();
                let mut request = tonic::Request::new(pb::AcquireRequest {
                    item_id: self.workload.item.clone(),
                    user_id,
                    quantity,
                    idempotency_key: key,
                    ..Default::default()
                });
                request.set_timeout(CALL_TIMEOUT);
                if let Some(auth) = &self.workload.authorization {
                    request.metadata_mut().insert("authorization", auth.clone());
                }
                let answer = match tokio::time::timeout(CALL_TIMEOUT, client.acquire(request)).await {
                    Ok(Ok(r)) => r.into_inner(),
                    Ok(Err(status)) => return self.record_error(format!("{:?}", status.code())),
                    Err(_) => return self.record_error("client timeout".to_owned()),
                };
                self.record_answer(seq, answer)
            }
            Target::Client(client) => {
                use inventory_client::Acquired;
                let item = self.workload.item.clone();
                match client.acquire(&item, &user_id, quantity, &key).await {
                    Ok(Acquired::Reserved { id, replayed, .. }) => {
                        self.record_reserved(seq, id, replayed);
                        Class::Ok
                    }
                    Ok(Acquired::SoldOut) => {
                        self.ledger.sold_out += 1;
                        Class::SoldOut
                    }
                    Ok(Acquired::LimitExceeded { .. }) => {
                        self.ledger.limit_exceeded += 1;
                        Class::LimitExceeded
                    }
                    Ok(Acquired::NotStarted { .. }) => self.record_error("not started".to_owned()),
                    Err(e) => self.record_error(e.kind().to_owned()),
                }
            }
            Target::Store { store, pool, segments, per_user_limit, reservation_ttl_ms } => {
                let (store, mut pool) = (Arc::clone(store), pool.clone());
                let (segments, per_user_limit, reservation_ttl_ms) = (*segments, *per_user_limit, *reservation_ttl_ms);
                pool.segment = inventory_core::segments::route(&user_id, segments);
                let args = AcquireArgs {
                    user_id,
                    quantity,
                    idempotency_key: key,
                    new_reservation_id: store.new_reservation_id(pool.segment),
                    per_user_limit,
                    reservation_ttl_ms,
                    expect_generation: None,
                    allow_partial: false,
                };
                match tokio::time::timeout(CALL_TIMEOUT, store.acquire(&pool, &args)).await {
                    Ok(Ok(AcquireResult::Reserved { reservation_id, replayed, .. })) => {
                        self.record_reserved(seq, reservation_id, replayed);
                        Class::Ok
                    }
                    Ok(Ok(AcquireResult::SoldOut { .. })) => {
                        self.ledger.sold_out += 1;
                        Class::SoldOut
                    }
                    Ok(Ok(AcquireResult::LimitExceeded { .. })) => {
                        self.ledger.limit_exceeded += 1;
                        Class::LimitExceeded
                    }
                    Ok(Ok(AcquireResult::KeyConflict)) => self.record_error("key conflict".to_owned()),
                    Ok(Err(e)) => self.record_error(format!("store: {e}")),
                    Err(_) => self.record_error("client timeout".to_owned()),
                }
            }
        }
    }
}

/// The outcome check over every caller of a run (warm-up included).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Outcome {
    pub reserved_answers: u64,
    pub replayed_answers: u64,
    pub distinct_reservations: u64,
    pub units_reserved: u64,
    pub stock: Option<u64>,
    pub sold_out_answers: u64,
    pub limit_exceeded_answers: u64,
    pub replay_mismatches: u64,
    pub errors: BTreeMap<String, u64>,
    /// Units reserved beyond the stock: must be 0.
    pub oversold_units: u64,
    pub ok: bool,
}

pub fn check<'a>(ledgers: impl IntoIterator<Item = &'a Ledger>, quantity: u64, stock: Option<u64>) -> Outcome {
    let mut o = Outcome { stock, ..Default::default() };
    let mut ids: HashSet<&str> = HashSet::new();
    for l in ledgers {
        o.reserved_answers += l.reserved_answers;
        o.replayed_answers += l.replayed_answers;
        o.sold_out_answers += l.sold_out;
        o.limit_exceeded_answers += l.limit_exceeded;
        o.replay_mismatches += l.replay_mismatches;
        for (what, n) in &l.errors {
            *o.errors.entry(what.clone()).or_default() += n;
        }
        ids.extend(l.reserved_by_key.values().map(|b| &**b));
    }
    o.distinct_reservations = ids.len() as u64;
    o.units_reserved = o.distinct_reservations * quantity;
    o.oversold_units = stock.map_or(0, |s| o.units_reserved.saturating_sub(s));
    o.ok = o.oversold_units == 0 && o.replay_mismatches == 0;
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(entries: &[(u64, &str)]) -> Ledger {
        let mut l = Ledger::default();
        for (seq, id) in entries {
            l.reserved_by_key.insert(*seq, (*id).into());
            l.reserved_answers += 1;
        }
        l
    }

    #[test]
    fn counts_distinct_reservations_against_the_stock() {
        let a = ledger(&[(0, "r1"), (1, "r2")]);
        let b = ledger(&[(0, "r3")]);
        let o = check(&[a, b], 2, Some(6));
        assert_eq!((o.distinct_reservations, o.units_reserved, o.oversold_units), (3, 6, 0));
        assert!(o.ok);
        let o = check(&[ledger(&[(0, "r1"), (1, "r2")])], 2, Some(3));
        assert_eq!(o.oversold_units, 1);
        assert!(!o.ok);
        let mut bad = ledger(&[(0, "r1")]);
        bad.replay_mismatches = 1;
        assert!(!check(&[bad], 1, None).ok);
    }
}
