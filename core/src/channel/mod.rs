//! The agent's rules for one channel, as a deterministic state machine without I/O.
//!
//! Each item the channel sells has one [`ItemCore`]: an explicit [`Mode`] (selling, lost,
//! in doubt), what the agent believes of the center's supply, its shelf (the sold-out fast
//! path), and its **stocking queue**: the Borrows, Returns and resyncs of the item run one
//! at a time, in order, each a small state machine ([`ops`]). The queue is what keeps a
//! resync from ever seeing units taken out for a Return that has not reached the center,
//! and two Borrows from topping up one pool at once.
//!
//! Inputs are plain values: the time and the channel's epoch ([`Ctx`]), a pool's counters
//! ([`PoolView`]), the center's answers ([`Reply`]), the channel's events. Outputs are
//! [`Work`]: one effect to carry out for the running operation (read the pool, refill
//! this grant, call Borrow with this id and epoch, ...), whose result is fed back with
//! [`ItemCore::feed`], and the operations that finished ([`Step::finished`]), with
//! [`Note`]s for logs and metrics.
//!
//! Two drivers run these rules: the agent (its gRPC edge, pool store, center link and
//! timers; `agent/src/stocking.rs`) and the seeded simulator (`sim/`), with a simulated
//! network, clock and faults. The rules are never written twice.
//!
//! **Architecture invariant:** nothing here does I/O, reads a clock, spawns, or draws a
//! random number; fresh ids come in from the driver.

mod effects;
mod item;
pub mod lease;
pub mod ops;
mod plan;
mod quiet;
#[cfg(test)]
mod quiet_tests;
#[cfg(test)]
mod rate_tests;
#[cfg(test)]
mod reserve_tests;
#[cfg(test)]
mod segment_loss_tests;
#[cfg(test)]
mod settle_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod write_answer_tests;

pub use item::{Admission, Gate, ItemCore, MissPlan, Mode, ReadToken, Refusal, Shelf, Supply};
pub use ops::{CallFault, Effect, OpId, OpKind, OpResult, Reply, ResyncWhy, StoreFault, Work};
pub use plan::{ResyncPlan, resync_plan};
pub use quiet::{PoolStamp, full_reads_per_heartbeat};

use crate::watermarks::{RateBatching, Watermarks};

/// The item's settings as the center describes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub per_user_limit: u64,
    pub reservation_ttl_ms: u64,
    /// Fixed watermarks: the operator's, and those of a pool that has not sold yet.
    pub watermarks: Watermarks,
    /// Rate-following batches (`None`: the fixed watermarks always apply).
    pub rate_batching: Option<RateBatching>,
    /// The item is closed: every Acquire is SOLD_OUT.
    pub closed: bool,
}

/// A pool's counters as the store reported them. `generation` is 0 when the pool does
/// not exist in the store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolView {
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    pub generation: u64,
}

impl PoolView {
    /// `available + reserved + sold`: what the pool accounts for.
    pub fn total(&self) -> u64 {
        self.available.saturating_add(self.reserved).saturating_add(self.sold)
    }
}

/// What the center says the channel holds of an item (RegisterAgent's holdings,
/// DescribeItem).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holding {
    /// granted - returned - reclaimed.
    pub held: u64,
    /// The generation the channel last reported (0: never).
    pub generation: u64,
    /// Units the center holds in doubt for the channel.
    pub in_doubt: u64,
}

/// One pool as a heartbeat reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Report {
    /// The pool's counters (and generation).
    Counts(PoolView),
    /// The store lost the pool: everything the channel holds is in doubt.
    Lost,
}

/// The inputs every transition may use: the driver's clock and the channel's epoch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ctx {
    pub now_ms: i64,
    /// The epoch the channel registered with (0 before the first registration).
    pub epoch: u64,
}

/// Tunables of the rules (the agent's flags; the simulator's constants).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// How long the pool must stay above the high watermark before surplus goes back.
    pub return_sustain_ms: u64,
    /// At most one starvation Borrow per item per this many ms.
    pub starving_signal_every_ms: i64,
    /// After a Borrow or Return with an unknown outcome, resync the pool this much later
    /// (a late attempt has landed or been refused by then: longer than the link's deadline).
    pub resync_after_unknown_ms: i64,
    /// After a pool is found lost, ask the center this much later: if the channel held
    /// nothing of the item, nothing was lost.
    pub lost_resync_after_ms: i64,
    /// Attempts of a grant's refill on a store error (the grant is the channel's at the
    /// center either way; a refill that never lands shows as drift until a resync).
    pub refill_attempts: u32,
    /// Half-life of the pools' sell rate average.
    pub rate_half_life_ms: u64,
    /// After the store refused a write (at its memory limit), no Borrow for this long.
    pub store_refused_pause_ms: i64,
    /// A heartbeat may report a pool from its last whole read while the pool's write
    /// sequence has not moved, for at most this long ([`ItemCore::report_unchanged`]).
    pub full_read_every_ms: i64,
    /// A look may decide from the pool's last whole look while its write sequence has not
    /// moved and it held no reservation, for at most this long
    /// ([`ItemCore::look_unchanged`]); past it a look sweeps and reads the pool whole again
    /// (which also forgets its old finished records).
    pub whole_look_every_ms: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            return_sustain_ms: 2_000,
            starving_signal_every_ms: 200,
            resync_after_unknown_ms: 5_000,
            lost_resync_after_ms: 1_000,
            refill_attempts: 5,
            rate_half_life_ms: crate::rate::DEFAULT_HALF_LIFE_MS,
            store_refused_pause_ms: 2_000,
            full_read_every_ms: quiet::FULL_READ_EVERY_MS,
            whole_look_every_ms: quiet::WHOLE_LOOK_EVERY_MS,
        }
    }
}

/// Something worth a log line or a metric; the rules say it, the driver records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Note {
    /// The pool's generation changed or it vanished: the item is frozen.
    PoolLost { known: u64, now: u64 },
    /// A grant came back short.
    BorrowShort { want: u64, granted: u64 },
    /// A call to the center failed (`unknown`: it may have been applied).
    CenterFailed { call: &'static str, unknown: bool },
    /// A pool store operation failed.
    StoreFailed { what: &'static str },
    /// A grant arrived after a later incarnation fenced the pool: its resync counts it.
    GrantFenced { granted: u64 },
    /// The center answered a registration with `epoch`, and the pool was already fenced
    /// at `fence`, at or above it: the epoch was handed out before (its ledger went back).
    EpochReused { epoch: u64, fence: u64 },
    /// A grant could not be put into the pool after every attempt.
    GrantNotRefilled { granted: u64 },
    /// ... and went back to the center (the store refused to shelve it).
    GrantGivenBack { granted: u64 },
    /// A Return was refused by the center; its units went back into the pool.
    ReturnRefused,
    /// A Borrow (`borrow`) or Return of unknown outcome was answered for by its replay.
    Settled { borrow: bool },
    /// A resync added or removed units.
    Aligned { added: u64, removed: u64 },
    /// A resync found reserved or sold units beyond what the center granted.
    BeyondGrant { units: u64 },
    /// The center holds units of the item in doubt: not selling it.
    InDoubt,
    /// Selling again after a lost pool or units in doubt were settled (or the lost part
    /// of a pool was reopened).
    Unfrozen,
    /// Part of the pool (some segments) was lost: the intact part sells, nothing is
    /// borrowed or given back until the lost part is reopened.
    SegmentsLost,
}

/// What one transition produced: the operations that finished, the next effect to carry
/// out (at most one per item at a time), and notes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub finished: Vec<(OpId, OpResult)>,
    pub next: Option<Work>,
    pub notes: Vec<Note>,
}

impl From<&crate::pool::PoolSnapshot> for PoolView {
    fn from(s: &crate::pool::PoolSnapshot) -> Self {
        Self { available: s.available, reserved: s.reserved, sold: s.sold, generation: s.generation }
    }
}
