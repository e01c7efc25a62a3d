//! What a run injects (faults, rivals, reclaims, deliberate breakage of the center), the
//! agent's tunables as the simulated agents are configured, and what a broken rule is.

use std::fmt;

use inventory_core::channel::Settings;

/// Channel names, in order; a world uses the first `n`.
pub const CHANNELS: [&str; 4] = ["app", "web", "eu-west", "partner"];
/// Item names, in order; a world uses the first `n`.
pub const ITEMS: [&str; 2] = ["skin", "bundle"];

/// Lease of an agent's registration (`--lease-ttl-ms` at the center), and the grace before
/// a reclaim is allowed.
pub const LEASE_TTL_MS: u64 = 3_000;
pub const RECLAIM_GRACE_MS: u64 = 1_000;
/// The agent stops selling this long before its lease runs out (`--lease-margin-ms`).
pub const LEASE_MARGIN_MS: u64 = 1_000;
/// The agent heartbeats every third of its lease (`workers::heartbeat`).
pub const HEARTBEAT_EVERY_MS: i64 = 1_000;
/// How long an Acquire that found the pool empty waits for its Borrow (`--miss-wait-ms`).
pub const MISS_WAIT_MS: i64 = 2_000;
/// How long a pool stays above high before surplus goes back (`AgentSettings`; shorter
/// than the agent's default so that runs of a few seconds give back).
pub const RETURN_SUSTAIN_MS: u64 = 500;
/// A quiet pool is looked at this often by the rebalancer (`workers::IDLE_LOOK_EVERY_MS`).
pub const IDLE_LOOK_EVERY_MS: i64 = 500;
/// Attempts of one Borrow/Return by the link, all with the same request id and epoch
/// (`link::ATTEMPTS`).
pub const LINK_ATTEMPTS: u32 = 5;
/// With [`Faults::bounded_delays`], a call or reply lands (or is gone) at most this long
/// after it was sent: the link's deadline per attempt (`--center-timeout-ms`). Shorter
/// than `Settings::resync_after_unknown_ms`, the assumption that resync relies on.
pub const MAX_DELAY_MS: i64 = 2_000;

/// The bound on reporting a pool from its last whole read: well within a run, so both the
/// bound and the stamps decide reports (`Settings::full_read_every_ms`).
pub const FULL_READ_EVERY_MS: i64 = 5_000;

/// The bound on deciding a look from the last whole look: well within a run, so both the
/// bound and the stamps decide looks (`Settings::whole_look_every_ms`).
pub const WHOLE_LOOK_EVERY_MS: i64 = 8_000;

/// The rules' tunables as the simulated agents run them.
pub fn settings() -> Settings {
    Settings {
        return_sustain_ms: RETURN_SUSTAIN_MS,
        full_read_every_ms: FULL_READ_EVERY_MS,
        whole_look_every_ms: WHOLE_LOOK_EVERY_MS,
        ..Settings::default()
    }
}

/// Which faults a run injects. Percentages are per opportunity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// A Borrow/Return attempt (or a DescribeItem) vanishes before the center sees it.
    pub lose_request_pct: u32,
    /// The center applied the call but the reply never arrives.
    pub lose_reply_pct: u32,
    /// A heartbeat is lost (the lease is not renewed): with enough of them a live agent's
    /// lease expires and it can be reclaimed while it still sells (a partition).
    pub lose_heartbeat_pct: u32,
    /// Agents crash (volatile memory lost, pool kept) and restart.
    pub crashes: bool,
    /// Agents stop gracefully (SIGTERM: give back what is unreserved, final report).
    pub stops: bool,
    /// When the operator reclaims a channel whose lease expired (plus grace).
    pub reclaims: Reclaims,
    /// A pool's store loses its data (Redis restarted without persistence).
    pub pool_data_loss: bool,
    /// A pool's store goes back to an earlier snapshot of the pool: same generation, older
    /// contents (Redis restarted from an older RDB, a lagging replica promoted).
    pub pool_rollback: bool,
    /// Second processes of a running agent's channel registering, fencing it.
    pub rivals: Rivals,
    /// Calls and replies land or are gone within [`MAX_DELAY_MS`] of being sent (off: a
    /// call may reach the center any time later, e.g. after the agent's resync).
    pub bounded_delays: bool,
    /// A pool store may lose a pool between a Borrow's check of the pool once the grant is
    /// in and its refill (which must then find the pool missing). Off, stores lose pools
    /// at any other moment, including while the Borrow's call is out.
    pub loss_before_refill: bool,
    /// An attempt may still be on its way when the link gives up on its call, and land
    /// afterwards (within [`MAX_DELAY_MS`] with bounded delays). Off, the attempts of a
    /// call given up are lost: an unknown outcome comes only from lost replies.
    pub late_attempts: bool,
    /// The center's database stops answering for a few seconds to half a minute: calls
    /// that reach the center meanwhile wait in their transactions and are applied when it
    /// comes back, in any order, long after the agent gave up on them; DescribeItem and
    /// heartbeats fail meanwhile.
    pub outages: bool,
    /// A channel's pool store reaches its memory limit for a while and refuses writes
    /// before it writes anything (stocking writes only: Acquires are not refused).
    pub store_full: bool,
    /// Scheduled items (an opening ahead, a lead, a reserve, sometimes an end), moved by
    /// the operator and closed by the center, and agents' clocks skewed from the center's
    /// (`crate::schedules`).
    pub schedules: bool,
    /// The center's database goes back to an earlier state (its last commits lost, epochs
    /// too), and the center restarts on it (`crate::rollback`).
    pub ledger_rollback: bool,
    /// An agent's WatchChannel stream falls further behind than the center keeps events:
    /// the events it had not heard are gone, the center ends the stream, and the agent
    /// watches again and re-reads every item (`World::watch_lag`).
    pub watch_lags: bool,
}

impl Faults {
    /// Everything the rules survive together: lost, late (any time later, also after the
    /// agent's resync), reordered and replayed calls and their unknown outcomes, attempts
    /// landing after the link gave up, outages of the center's database (calls applied
    /// when it returns), crashes, graceful stops and restarts, stale calls of dead
    /// incarnations, second processes fencing running agents with calls in flight, pool
    /// stores losing their data at any moment but the refill window, and reclaims of
    /// agents that stopped gracefully. Reclaims of crashed or partitioned agents, the
    /// refill window and a shared pool store have scenarios of their own.
    pub const DEFAULT: Faults = Faults {
        lose_request_pct: 5,
        lose_reply_pct: 10,
        lose_heartbeat_pct: 0,
        crashes: true,
        stops: true,
        reclaims: Reclaims::StoppedAgents,
        pool_data_loss: true,
        pool_rollback: true,
        rivals: Rivals::Fence,
        bounded_delays: false,
        loss_before_refill: false,
        late_attempts: true,
        outages: true,
        store_full: true,
        schedules: true,
        ledger_rollback: false,
        watch_lags: false,
    };
}

/// Second processes of a channel (a deploy overlapping the running agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rivals {
    Never,
    /// It registers (a new epoch) and dies before its resync: the running agent is fenced
    /// with its calls in flight and registers again at its next heartbeat.
    Fence,
    /// It registers, then resyncs (with rules of its own) the pools of the store it shares
    /// with the running agent, reports and stops: both believe they lead the channel.
    SharedStore,
}

/// The operator's use of `invctl reclaim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaims {
    Never,
    /// Only channels whose agent stopped gracefully: its final report is exact.
    StoppedAgents,
    /// Whenever the lease has expired for the grace period.
    LeaseExpired,
}

/// Deliberate breakage of the center, to show the checker catches real mistakes (the
/// simulator is not vacuous). All off in real runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Breakage {
    /// The center applies Borrow/Return whatever epoch they carry.
    pub skip_epoch_check: bool,
    /// The center ignores its request table: a replayed Borrow/Return applies again.
    pub apply_replays: bool,
    /// Agents take their own clock for the center's (no offset measured): a skewed agent
    /// opens and closes its sales by the wrong clock.
    pub trust_agent_clock: bool,
    /// The pool store's stamps miss writes (as a Lua script that wrote without raising the
    /// pool's write sequence would): a quiet heartbeat reports a pool as last read whole.
    pub stamps_miss_writes: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Random steps before the run drains to quiescence and sells out.
    pub steps: usize,
    pub faults: Faults,
    pub breakage: Breakage,
    /// At quiescence, every agent registers again and resyncs before invariant 2 is
    /// checked. Without it, a running agent keeps whatever drift the faults left until
    /// its own scheduled resyncs settle it.
    pub resync_at_quiescence: bool,
    /// Units in doubt while no pool store lost data and no reclaim put them in doubt are
    /// a violation (invariant 7: they stay stranded until an operator resolves them).
    pub doubt_requires_data_loss: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            steps: 300,
            faults: Faults::DEFAULT,
            breakage: Breakage::default(),
            resync_at_quiescence: false,
            doubt_requires_data_loss: true,
        }
    }
}

/// One broken rule: which invariant (as numbered in the brief) and what was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: &'static str, detail: impl Into<String>) -> Self {
        Self { invariant, detail: detail.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invariant {}: {}", self.invariant, self.detail)
    }
}
