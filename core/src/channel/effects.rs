//! The vocabulary between the rules and their drivers: what an operation is for, the
//! effects it asks for, and the replies and outcomes that come back. The state machines
//! that use them are in [`super::ops`].

use super::{Holding, PoolView};

/// Identifies one operation of one item (unique per item).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// Why a pool is resynced with the center's view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncWhy {
    /// A (re)registration under `epoch`: fence the pool first, so no call of an earlier
    /// incarnation moves its units any more, then settle the calls of unknown outcome
    /// (while a Return among them is unanswered, units are only taken away; the scheduled
    /// resync adds what is missing).
    Registration { epoch: u64 },
    /// The resync scheduled after an unknown outcome or a lost pool (skipped if no longer
    /// due when it runs).
    Scheduled,
    /// An operator settled the units in doubt: align the pool to what the channel holds
    /// now and sell again.
    Resolved,
}

/// What an operation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// Borrow `want` units (skipped if another Borrow finished since it was queued).
    Borrow {
        want: u64,
    },
    /// Take up to `max` available units out of the pool and return them to the center.
    Return {
        max: u64,
    },
    Resync(ResyncWhy),
}

/// One effect for the driver to carry out; its result comes back as a [`Reply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Read the pool's counters and generation ([`Reply::Pool`]).
    ReadPool,
    /// Create the pool if missing (a refill of 0 units under `grant_id`) ([`Reply::Done`]).
    OpenPool { grant_id: String, epoch: u64 },
    /// Add `units` once per `grant_id`; `must_exist`: never create the pool
    /// ([`Reply::Done`]). `after_ms`: wait this long first (a retry).
    Refill { grant_id: String, units: u64, epoch: u64, must_exist: bool, after_ms: u64 },
    /// Take up to `max` available units, once per `take_id` ([`Reply::Units`]).
    Take { take_id: String, max: u64, epoch: u64 },
    /// Put back what `take_id` took ([`Reply::Units`]).
    Untake { take_id: String, epoch: u64 },
    /// Raise the pool's fence to `epoch` ([`Reply::Fence`] with the fence found before).
    RaiseFence { epoch: u64 },
    /// Call the center's Borrow, every attempt with this id and epoch ([`Reply::Granted`]).
    /// `sell_rate_milli`: the pool's sell rate when the call was decided, for the center's
    /// share of a short supply (not part of the request's identity).
    Borrow { request_id: String, quantity: u64, epoch: u64, sell_rate_milli: u64 },
    /// Call the center's Return, every attempt with this id and epoch ([`Reply::Done`]).
    Return { request_id: String, quantity: u64, epoch: u64 },
    /// Ask the center what the channel holds of the item ([`Reply::Holding`]).
    Describe,
}

/// A store operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreFault {
    /// A later incarnation of the channel fenced the pool.
    Fenced,
    /// The pool does not exist (a must-exist refill).
    PoolMissing,
    /// The store refused the write and applied nothing (it is at its memory limit): a
    /// refill refused on its last attempt never lands.
    Refused,
    /// Anything else (store down, protocol error).
    Failed,
}

/// A call to the center that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFault {
    /// Refused (stale epoch, more than held): not applied.
    Refused,
    /// The center does not know the item: not applied.
    NotFound,
    /// No answer after every attempt: it may have been applied.
    Unknown,
}

/// The result of an [`Effect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Pool(PoolView),
    Done,
    /// A refill ([`Effect::OpenPool`], [`Effect::Refill`]) done, answered with the pool as
    /// the write left it, at write sequence `write_seq`. The store checks every structure
    /// of the pool before it writes, as a whole read does, so the answer stands for a whole
    /// read taken at the write (`quiet`). A store that cannot answer so replies
    /// [`Reply::Done`].
    Wrote {
        view: PoolView,
        write_seq: u64,
    },
    Units(u64),
    /// The fence a [`Effect::RaiseFence`] found before it raised it (a segmented item's:
    /// the highest of its segments').
    Fence {
        found: u64,
    },
    Granted {
        granted: u64,
        center_available: u64,
    },
    Holding(Holding),
    Store(StoreFault),
    Center(CallFault),
}

/// The effect of the running operation `op`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub op: OpId,
    pub effect: Effect,
}

/// How an operation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpResult {
    /// A Borrow ran: `granted` units were put into the pool (0: none granted, or it failed).
    Borrowed { granted: u64 },
    /// A queued Borrow found that another Borrow finished meanwhile.
    Skipped,
    /// A Return gave back `units` (0: nothing taken, refused, or outcome unknown).
    Returned { units: u64 },
    /// A resync ran to the end (or found itself no longer due).
    Resynced,
    /// The operation could not finish: a store or center call failed.
    Failed,
    /// A registration's resync found the pool already fenced at `fence`, at or above the
    /// epoch the center answered (a ledger that went back handed it out again): nothing
    /// was written; the agent registers again above the fence
    /// ([`crate::ledger::fence`]).
    EpochReused { fence: u64 },
}
