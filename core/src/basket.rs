//! Baskets: several items reserved for one user all or nothing.
//!
//! The lines of one basket live in different pools (different Redis slots), so no single
//! atomic step can reserve them together. Instead a basket is an **intent** recorded in
//! the channel's store before any line is touched; each line is an ordinary Acquire whose
//! idempotency key is derived from the basket's key, the item and the attempt
//! ([`line_key`]), so a replay, a waiting caller and the recovery after a crash all find
//! the same reservation. A basket that cannot be served (or whose driver died) is undone
//! by cancelling every line's reservation found by its derived key.
//!
//! States of an intent:
//!
//! ```text
//! Pending ──all lines reserved──▶ Reserved ──▶ Confirmed
//!    │                               └──────▶ Cancelled
//!    └──a line short, an error, or older than the bound──▶ Releasing ──lines cancelled──▶ Failed
//! Failed ──a replay of the key──▶ Pending (next attempt: new derived keys)
//! ```
//!
//! Pending and Releasing are **open**: the sweeper completes the compensation of an open
//! intent last written longer ago than the bound ([`due_for_compensation`]). The driver
//! starts no line after half the bound ([`may_start_line`]), so, with the bound at least
//! twice the longest Acquire, no line of a live driver is in flight when the sweeper
//! undoes its basket; the driver's own last step is a compare-and-set from Pending, which
//! fails once compensation began, and then it cancels its lines too.
//!
//! Nothing here does I/O; `agent/src/baskets/` drives it.

use std::collections::BTreeMap;

use crate::ids::{ItemId, MAX_QUANTITY, Quantity, RequestId, UserId, ValidationError};

/// The most lines one basket may have.
pub const MAX_LINES: usize = 32;

/// One line of a basket as requested (quantity 0 already read as 1).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Line {
    pub item_id: String,
    pub quantity: u64,
}

/// A validated AcquireBasket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Basket {
    pub user_id: String,
    pub idempotency_key: String,
    pub lines: Vec<Line>,
}

impl Basket {
    /// Parses at the edge: the user, the key, 1..=[`MAX_LINES`] lines of valid item ids and
    /// quantities (0 means 1), and each item's lines summed within [`MAX_QUANTITY`].
    /// Errors name the field, e.g. `lines[1].item_id`.
    pub fn parse(user_id: &str, idempotency_key: &str, lines: &[(&str, u64)]) -> Result<Self, ValidationError> {
        let user = UserId::parse("user_id", user_id)?;
        let key = RequestId::parse("idempotency_key", idempotency_key)?;
        if lines.is_empty() {
            return Err(ValidationError::new("lines", "[]", "must have at least one line"));
        }
        if lines.len() > MAX_LINES {
            return Err(ValidationError::new(
                "lines",
                format!("{} lines", lines.len()).as_str(),
                format!("must have at most {MAX_LINES} lines"),
            ));
        }
        let mut parsed = Vec::with_capacity(lines.len());
        let mut sums: BTreeMap<&str, u64> = BTreeMap::new();
        for (i, (item, quantity)) in lines.iter().enumerate() {
            let item = ItemId::parse(&format!("lines[{i}].item_id"), item)?;
            let quantity = match quantity {
                0 => 1,
                q => Quantity::parse(&format!("lines[{i}].quantity"), *q)?.get(),
            };
            let sum = sums.entry(lines[i].0).or_default();
            *sum = sum.saturating_add(quantity);
            if *sum > MAX_QUANTITY {
                return Err(ValidationError::new(
                    format!("lines[{i}].quantity"),
                    quantity,
                    format!("lines of item {item} sum to {sum}, above {MAX_QUANTITY}"),
                ));
            }
            parsed.push(Line { item_id: item.to_string(), quantity });
        }
        Ok(Self { user_id: user.to_string(), idempotency_key: key.to_string(), lines: parsed })
    }

    /// The basket's id: derived from its key, so every agent of the channel finds one
    /// key's intent under one id.
    pub fn id(&self) -> String {
        basket_id(&self.idempotency_key)
    }

    /// Each item once, with the sum of its lines, in the order of first appearance.
    pub fn sums(&self) -> Vec<Line> {
        sums(&self.lines)
    }

    /// The sum of `item`'s lines must fit the item's per-user limit: the first line where
    /// the running sum passes it is named (a basket that can never be served).
    pub fn check_limit(&self, item_id: &str, limit: u64) -> Result<(), ValidationError> {
        let mut sum = 0u64;
        for (i, line) in self.lines.iter().enumerate().filter(|(_, l)| l.item_id == item_id) {
            sum = sum.saturating_add(line.quantity);
            if sum > limit {
                return Err(ValidationError::new(
                    format!("lines[{i}].quantity"),
                    line.quantity,
                    format!("lines of item {item_id} sum to {sum}, above its per-user limit {limit}"),
                ));
            }
        }
        Ok(())
    }
}

fn sums(lines: &[Line]) -> Vec<Line> {
    let mut out: Vec<Line> = Vec::new();
    for line in lines {
        match out.iter_mut().find(|l| l.item_id == line.item_id) {
            Some(l) => l.quantity = l.quantity.saturating_add(line.quantity),
            None => out.push(line.clone()),
        }
    }
    out
}

/// FNV-1a over the parts, 128 bits, each part followed by a 0 byte (ids never hold one).
/// Not a defence against chosen collisions: a collision only makes the same client's own
/// requests conflict (the pool checks the user and quantity of a replayed key).
fn fnv1a_128(parts: &[&[u8]]) -> u128 {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for part in parts {
        for b in part.iter().chain(std::iter::once(&0u8)) {
            h ^= u128::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    }
    h
}

/// The basket id of an idempotency key: 32 hex digits.
pub fn basket_id(idempotency_key: &str) -> String {
    format!("{:032x}", fnv1a_128(&[b"basket", idempotency_key.as_bytes()]))
}

/// The idempotency key of one item's Acquire in attempt `attempt` of the basket with
/// `basket_key`: `basket.` and 32 hex digits (a valid key, distinct per item and attempt).
pub fn line_key(basket_key: &str, item_id: &str, attempt: u32) -> String {
    let attempt = attempt.to_string();
    format!("basket.{:032x}", fnv1a_128(&[b"line", basket_key.as_bytes(), item_id.as_bytes(), attempt.as_bytes()]))
}

/// One item's reservation in a reserved basket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Held {
    pub item_id: String,
    pub reservation_id: String,
    pub quantity: u64,
    pub expires_at_ms: i64,
    pub pool_generation: u64,
}

/// Why a basket reserved nothing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Failure {
    SoldOut {
        item_id: String,
    },
    LimitExceeded {
        item_id: String,
        remaining: u64,
    },
    /// A line's Acquire failed (the store or the center down, a key conflict): the error
    /// was the answer; the basket is undone.
    Error {
        item_id: String,
    },
    /// Its driver stopped (crash, or too slow) before it finished: undone by recovery.
    Interrupted,
    /// A line's item has not opened yet (its sale's schedule).
    NotStarted {
        item_id: String,
        opens_at_ms: i64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum State {
    Pending,
    Reserved { held: Vec<Held> },
    Releasing { failure: Failure },
    Failed { failure: Failure },
    Confirmed { held: Vec<Held> },
    Cancelled { held: Vec<Held> },
}

/// The recorded intent of one basket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Intent {
    pub user_id: String,
    pub idempotency_key: String,
    pub lines: Vec<Line>,
    /// Which attempt's derived keys the lines use (a replay after a failure tries again).
    pub attempt: u32,
    pub state: State,
}

/// A transition the intent's state does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The basket is not reserved (pending, failed): as unknown to Confirm/Cancel.
    #[error("basket is not reserved")]
    NotReserved,
    /// Confirm after cancel, cancel after confirm.
    #[error("basket is {0}")]
    Finished(&'static str),
    /// Any other transition (a bug in the driver, or a lost race it must re-read).
    #[error("basket is {0}")]
    Wrong(&'static str),
}

impl Intent {
    pub fn new(basket: &Basket) -> Self {
        Self {
            user_id: basket.user_id.clone(),
            idempotency_key: basket.idempotency_key.clone(),
            lines: basket.lines.clone(),
            attempt: 0,
            state: State::Pending,
        }
    }

    /// Same user and lines (in the same order): a replay; else the key is reused.
    pub fn same_request(&self, basket: &Basket) -> bool {
        self.user_id == basket.user_id && self.lines == basket.lines
    }

    /// Each item once with its summed quantity.
    pub fn sums(&self) -> Vec<Line> {
        sums(&self.lines)
    }

    /// The derived key of `item_id`'s line in the current attempt.
    pub fn line_key(&self, item_id: &str) -> String {
        line_key(&self.idempotency_key, item_id, self.attempt)
    }

    /// Pending and Releasing: compensation may be owed.
    pub fn is_open(&self) -> bool {
        matches!(self.state, State::Pending | State::Releasing { .. })
    }

    pub fn state_name(&self) -> &'static str {
        match self.state {
            State::Pending => "pending",
            State::Reserved { .. } => "reserved",
            State::Releasing { .. } => "releasing",
            State::Failed { .. } => "failed",
            State::Confirmed { .. } => "confirmed",
            State::Cancelled { .. } => "cancelled",
        }
    }

    fn to(&self, state: State) -> Self {
        Self { state, ..self.clone() }
    }

    /// Pending -> Reserved with one reservation per item.
    pub fn reserved(&self, held: Vec<Held>) -> Result<Self, Refused> {
        match self.state {
            State::Pending => Ok(self.to(State::Reserved { held })),
            _ => Err(Refused::Wrong(self.state_name())),
        }
    }

    /// Pending -> Releasing (compensation begins). Releasing stays (another party is
    /// already undoing it).
    pub fn releasing(&self, failure: Failure) -> Result<Self, Refused> {
        match &self.state {
            State::Pending => Ok(self.to(State::Releasing { failure })),
            State::Releasing { .. } => Ok(self.clone()),
            _ => Err(Refused::Wrong(self.state_name())),
        }
    }

    /// Releasing -> Failed, once every line's reservation is cancelled.
    pub fn failed(&self) -> Result<Self, Refused> {
        match &self.state {
            State::Releasing { failure } => Ok(self.to(State::Failed { failure: failure.clone() })),
            _ => Err(Refused::Wrong(self.state_name())),
        }
    }

    /// Failed -> Pending with the next attempt's keys: a replay of a basket that reserved
    /// nothing is evaluated again, as a replay of an Acquire that reserved nothing is.
    pub fn retry(&self) -> Result<Self, Refused> {
        match self.state {
            State::Failed { .. } => {
                Ok(Self { attempt: self.attempt.saturating_add(1), state: State::Pending, ..self.clone() })
            }
            _ => Err(Refused::Wrong(self.state_name())),
        }
    }

    /// The reservations of a basket that reserved (also once confirmed or cancelled).
    pub fn held(&self) -> Option<&[Held]> {
        match &self.state {
            State::Reserved { held } | State::Confirmed { held } | State::Cancelled { held } => Some(held),
            _ => None,
        }
    }

    /// Reserved -> Confirmed; Confirmed stays (idempotent).
    pub fn confirmed(&self) -> Result<Self, Refused> {
        match &self.state {
            State::Reserved { held } => Ok(self.to(State::Confirmed { held: held.clone() })),
            State::Confirmed { .. } => Ok(self.clone()),
            State::Cancelled { .. } => Err(Refused::Finished("cancelled")),
            _ => Err(Refused::NotReserved),
        }
    }

    /// Reserved -> Cancelled; Cancelled stays (idempotent).
    pub fn cancelled(&self) -> Result<Self, Refused> {
        match &self.state {
            State::Reserved { held } => Ok(self.to(State::Cancelled { held: held.clone() })),
            State::Cancelled { .. } => Ok(self.clone()),
            State::Confirmed { .. } => Err(Refused::Finished("confirmed")),
            _ => Err(Refused::NotReserved),
        }
    }
}

/// The answer's reservations: one per request line, in the request's order (lines of one
/// item share its reservation).
pub fn per_line<'a>(lines: &[Line], held: &'a [Held]) -> Vec<&'a Held> {
    lines.iter().filter_map(|l| held.iter().find(|h| h.item_id == l.item_id)).collect()
}

/// An open intent last written `age_ms` ago (by the store's clock) is the sweeper's to
/// undo once that is at least the bound.
pub fn due_for_compensation(intent: &Intent, age_ms: i64, bound_ms: u64) -> bool {
    intent.is_open() && u64::try_from(age_ms).unwrap_or(0) >= bound_ms
}

/// The driver starts a line's Acquire only within the first half of the bound, so no
/// Acquire of a live driver (bounded by the rest) is in flight once the bound is past.
pub fn may_start_line(elapsed_ms: u64, bound_ms: u64) -> bool {
    elapsed_ms < bound_ms / 2
}

/// What a request for a key whose intent exists does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnReplay {
    /// Another user or other lines under this key: ALREADY_EXISTS.
    Conflict,
    /// Reserved (or confirmed, cancelled since): the first answer again.
    Answer,
    /// Another caller is driving it: wait for it to settle.
    Wait,
    /// Open past the bound (its driver is gone): compensate, then evaluate again.
    Compensate,
    /// Failed: evaluate again with the next attempt.
    Retry,
}

pub fn on_replay(intent: &Intent, basket: &Basket, age_ms: i64, bound_ms: u64) -> OnReplay {
    if !intent.same_request(basket) {
        return OnReplay::Conflict;
    }
    match intent.state {
        State::Reserved { .. } | State::Confirmed { .. } | State::Cancelled { .. } => OnReplay::Answer,
        State::Failed { .. } => OnReplay::Retry,
        State::Pending | State::Releasing { .. } if due_for_compensation(intent, age_ms, bound_ms) => {
            OnReplay::Compensate
        }
        State::Pending | State::Releasing { .. } => OnReplay::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basket(lines: &[(&str, u64)]) -> Basket {
        Basket::parse("u1", "k1", lines).unwrap()
    }

    #[test]
    fn lines_of_one_item_are_summed_before_any_check() {
        let b = basket(&[("console", 2), ("pad", 0), ("console", 2)]);
        assert_eq!(b.lines[1].quantity, 1, "0 means 1");
        let sums = b.sums();
        assert_eq!(
            sums,
            vec![Line { item_id: "console".into(), quantity: 4 }, Line { item_id: "pad".into(), quantity: 1 }]
        );
        let e = b.check_limit("console", 3).unwrap_err();
        assert_eq!(e.field, "lines[2].quantity");
        assert!(e.reason.contains("sum to 4") && e.reason.contains("limit 3"), "{}", e.reason);
        assert!(b.check_limit("console", 4).is_ok() && b.check_limit("pad", 1).is_ok());
    }

    #[test]
    fn bad_lines_are_refused_naming_the_field() {
        let e = Basket::parse("u1", "k1", &[]).unwrap_err();
        assert_eq!(e.field, "lines");
        let many: Vec<(&str, u64)> = (0..=MAX_LINES).map(|_| ("a", 1)).collect();
        assert_eq!(Basket::parse("u1", "k1", &many).unwrap_err().field, "lines");
        let e = Basket::parse("u1", "k1", &[("ok", 1), ("bad id", 1)]).unwrap_err();
        assert_eq!((e.field.as_str(), e.value.as_str()), ("lines[1].item_id", "\"bad id\""));
        let e = Basket::parse("u1", "k1", &[("a", MAX_QUANTITY + 1)]).unwrap_err();
        assert_eq!(e.field, "lines[0].quantity");
        let e = Basket::parse("u1", "k1", &[("a", MAX_QUANTITY), ("a", 1)]).unwrap_err();
        assert_eq!(e.field, "lines[1].quantity");
        assert_eq!(Basket::parse("", "k1", &[("a", 1)]).unwrap_err().field, "user_id");
        assert_eq!(Basket::parse("u", "k 1", &[("a", 1)]).unwrap_err().field, "idempotency_key");
    }

    #[test]
    fn derived_keys_are_valid_stable_and_distinct() {
        let k = line_key("k1", "console", 0);
        assert!(RequestId::parse("k", &k).is_ok(), "{k}");
        assert_eq!(k, line_key("k1", "console", 0));
        assert_ne!(k, line_key("k1", "pad", 0));
        assert_ne!(k, line_key("k1", "console", 1));
        assert_ne!(k, line_key("k2", "console", 0));
        let id = basket_id("k1");
        assert!(RequestId::parse("basket_id", &id).is_ok() && id.len() == 32);
        assert_ne!(id, basket_id("k2"));
    }

    #[test]
    fn the_intent_moves_only_along_its_transitions() {
        let b = basket(&[("a", 1), ("b", 1)]);
        let i = Intent::new(&b);
        assert!(i.is_open());
        let held = vec![Held {
            item_id: "a".into(),
            reservation_id: "r".into(),
            quantity: 1,
            expires_at_ms: 5,
            pool_generation: 1,
        }];
        let r = i.reserved(held.clone()).unwrap();
        assert!(!r.is_open() && r.held() == Some(&held[..]));
        assert_eq!(r.reserved(held.clone()), Err(Refused::Wrong("reserved")));
        assert_eq!(r.releasing(Failure::Interrupted), Err(Refused::Wrong("reserved")));
        let c = r.confirmed().unwrap();
        assert_eq!(c.confirmed().unwrap(), c, "idempotent");
        assert_eq!(c.cancelled(), Err(Refused::Finished("confirmed")));
        let x = r.cancelled().unwrap();
        assert_eq!(x.confirmed(), Err(Refused::Finished("cancelled")));

        let rel = i.releasing(Failure::SoldOut { item_id: "b".into() }).unwrap();
        assert!(rel.is_open());
        assert_eq!(rel.releasing(Failure::Interrupted).unwrap(), rel, "the first failure stays");
        assert_eq!(rel.reserved(held), Err(Refused::Wrong("releasing")), "a driver loses to compensation");
        let f = rel.failed().unwrap();
        assert!(!f.is_open() && f.confirmed() == Err(Refused::NotReserved));
        let again = f.retry().unwrap();
        assert_eq!((again.attempt, again.state.clone()), (1, State::Pending));
        assert_ne!(again.line_key("a"), i.line_key("a"), "a new attempt never meets the old reservations");
    }

    #[test]
    fn replays_wait_answer_retry_or_take_over_compensation() {
        let b = basket(&[("a", 1)]);
        let i = Intent::new(&b);
        assert_eq!(on_replay(&i, &b, 10, 1_000), OnReplay::Wait);
        assert_eq!(on_replay(&i, &b, 1_000, 1_000), OnReplay::Compensate);
        let other = Basket::parse("u2", "k1", &[("a", 1)]).unwrap();
        assert_eq!(on_replay(&i, &other, 0, 1_000), OnReplay::Conflict);
        let other = basket(&[("a", 2)]);
        assert_eq!(on_replay(&i, &other, 0, 1_000), OnReplay::Conflict);
        let r = i.reserved(Vec::new()).unwrap();
        assert_eq!(on_replay(&r, &b, 1_000_000, 1_000), OnReplay::Answer);
        let f = i.releasing(Failure::Interrupted).unwrap().failed().unwrap();
        assert_eq!(on_replay(&f, &b, 0, 1_000), OnReplay::Retry);
        assert!(!due_for_compensation(&r, 1_000_000, 1_000));
        assert!(may_start_line(499, 1_000) && !may_start_line(500, 1_000));
    }

    #[test]
    fn per_line_answers_follow_the_request_order() {
        let b = basket(&[("a", 1), ("b", 1), ("a", 1)]);
        let h = |item: &str, q| Held {
            item_id: item.into(),
            reservation_id: format!("r-{item}"),
            quantity: q,
            expires_at_ms: 0,
            pool_generation: 1,
        };
        let held = vec![h("a", 2), h("b", 1)];
        let ids: Vec<_> = per_line(&b.lines, &held).iter().map(|h| h.reservation_id.as_str()).collect();
        assert_eq!(ids, ["r-a", "r-b", "r-a"]);
    }
}
