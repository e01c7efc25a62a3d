//! A deterministic, seeded, model-level simulator of the escrow protocol.
//!
//! One seed is one run: a world of 1–2 items and 2–4 channels, a few hundred random
//! events (buyers acquiring, confirming, cancelling and replaying keys; time passing,
//! reservations and leases expiring; the agents' rebalancer, heartbeat and event stream;
//! Borrow/Return calls delivered late, out of order, lost before the center or after it
//! applied them, retried with the same request id or given up; agents crashing, stopping
//! gracefully and restarting; second processes of a channel registering and fencing the
//! running agent; pool stores losing their data; stale calls of a dead incarnation arriving
//! after its successor registered; operators reclaiming expired channels and adding
//! stock), then a drain to quiescence, a resync of every agent, and a sale to the last
//! unit. Every invariant of the brief is checked after every step ([`check`]); the first
//! broken one ends the run with the seed, the rule and the last steps of the trace. The
//! same seed always gives the same trace: one PRNG ([`rng`]), ordered maps, no clock, no
//! threads.
//!
//! **Over the real rules:** the center's arithmetic, epochs, leases, reclaim, in-doubt
//! marking and resolution, the invariant check (`check_item`) and request fingerprints are
//! `inventory_core::ledger`; the watermark decision is `inventory_core::rebalance::decide`.
//! Also `ledger::reclaim_into_doubt` and `resolve_in_doubt` (only the `in_doubt` part is
//! settled; the channel keeps the rest), and `ledger::give_back` refusing a Return of
//! units in doubt. The pool is `inventory_core::pool::Pool` (acquire, confirm, cancel,
//! expiry, refills once per grant id, takes for return, fences), the model the in-memory
//! store `agent/src/store/memory.rs` wraps and the Lua scripts mirror. The request table
//! (replay before the epoch check, refusals not recorded), the Center service's Heartbeat
//! (a report with another generation, 0 included, than the last non-zero one is a lost
//! pool; the answer lists the channel's items with units in doubt, a lost pool only if
//! `mark_lost` put units in doubt; `last_report` stored per channel, reset by a
//! registration), the reclaim (`ledger::reclaim` only if the channel's last report was its
//! last word, `reclaim_into_doubt` otherwise) and DescribeItem's
//! `held`/`generation`/`in_doubt`, and the agent's paths (`agent.rs`, `link.rs`,
//! `items.rs`, `workers.rs`, `startup.rs`; a registration's resync only removing units
//! while an outcome of the item is unknown; the drain's final report with `last_report`;
//! an intact pool whose units are partly in doubt kept and reported as it is, but not sold
//! (`held_in_doubt`, also set by a heartbeat answer's `in_doubt_items`); on
//! `InDoubtResolved`, the pool aligned to the `held` DescribeItem reads under the lock;
//! nothing given back of a frozen or in-doubt item, and a pool lost while the channel held
//! none of it sold again after a resync 1 s later that finds `held 0` and nothing in
//! doubt; a grant refilled only into an existing pool, `refill_existing` checking inside
//! the script, the item frozen on `PoolMissing`; the pools' fences: a registration raises
//! each pool's fence to its epoch under the item's lock before it reads the center's view,
//! and `refill`, `refill_existing`, `take_for_return` and `untake` carry the caller's epoch
//! — `borrow_now`'s read before its first store call, `give_back`'s before its take, a
//! resync's the link's — and are refused below the fence; every attempt of a Borrow or
//! Return carrying that same epoch, the one its refill or untake carries, instead of the
//! link's when the call began) are mirrored in [`world`] and [`step`], each handler
//! naming what it mirrors.
//!
//! **Modelled:** per-call reordering and loss (calls are independent HTTP/2 streams), each
//! call or reply landing within the link's deadline ([`world::MAX_DELAY_MS`]); the link's
//! retries (same request id and the same epoch on every attempt, at most 5 attempts) and
//! its reachability flag (down after one unanswered attempt or heartbeat); each item's
//! `borrow_lock` (a fair mutex) held by a Borrow from its start to its refill and by a
//! Return from its take to the center's answer, with everything else that needs it queued
//! in order (other Borrow tasks, which skip if a Borrow finished meanwhile; give-backs; a
//! registration's resyncs; `resync_item`; the in-doubt resolution), and the rebalancer,
//! watcher and heartbeat worker blocked while they wait; the Acquire that misses, joins the
//! Borrow task and tries once more when it ends (racing the next task the lock passes to;
//! after `miss_wait` it has answered); the pool created (an `open-` refill of 0) and its
//! generation recorded before the first Borrow; a crash losing memory, tasks and the event
//! stream but keeping the pool and the requests on the wire (a crash can fall between a
//! grant and its refill, or a take and its Return); a graceful stop (no new calls from
//! buyers, workers finish, `return_all` item by item under the locks with the link's
//! retries, a final report, exit; a Borrow still in flight is abandoned); registration
//! (lease dropped; resyncs item by item under the locks, with lost-pool detection by
//! generation and in-doubt units; then the lease, and a report at once); heartbeats
//! reporting the pools (a frozen one as lost), renewing the lease, and stopping sales of
//! the items the center holds in doubt; a per-item resync 5 s (logical) after a Borrow or
//! Return with an unknown outcome (at quiescence, time moves on until each scheduled one is
//! due and the rebalancer runs it); reclaim; an operator resolving units in doubt at
//! quiescence with the true sold count (the pool's sold units and those sold from lost pool
//! data, less those written off before and those the channel keeps, `held - in_doubt`); the
//! sold-out fast path and the end-of-sale flags; and, in their scenarios, lost heartbeats
//! (a partition) and second processes sharing the pool store (two processes that both
//! believe they lead the channel, as in a deploy overlap: the second registers, fences and
//! resyncs every pool, reports and stops).
//!
//! **Not modelled:** reordering inside one stream (the event stream is in order); partial
//! execution of a store operation (each Lua script / critical section is atomic, as Redis
//! guarantees per script); store or database outages (calls to them always answer, so a
//! refill never fails); calls landing later than their deadline (the 5 s resync relies on
//! that; [`Faults::bounded_delays`] off allows it, no scenario does); heartbeats other than delivered at once or lost (so the agent's lease always
//! ends before the center's); the registration call itself being slow (it applies and
//! answers in one step, like DescribeItem); clock drift between agent and center; the
//! per-user rate limit, TLS and tokens; several center replicas; watermark changes and
//! item closing; the automatic reclaimer (the operator's reclaim is modelled); resolving
//! units in doubt while reservations are still open; the record retention sweep (runs are
//! far shorter than 24 h); wall-clock effects (time is logical and only moves by `Tick`
//! events); a registration whose reply is lost (it only bumps the epoch once more); the
//! rebalancer waiting up to `miss_wait` for a Borrow it asked for; the leader election of
//! a channel's replicas, followers selling under the leader's published lease and their
//! wants (one process per channel leads at a time, except the overlap of `shared-store`);
//! heartbeats carrying only the pools whose report changed (every heartbeat reports every
//! pool); the agent changes of 25b715b (the product counts the center unreachable only
//! after 3 unanswered calls in a row, where the model's flag drops at the first, so the
//! model's Acquires on an empty pool answer `UNAVAILABLE` more often; unknown item ids
//! remembered; item loading, as items are fixed per run).
//!
//! **Scenarios** ([`scenarios`]): `default` (everything above that the fixed logic
//! survives; reclaim only of gracefully stopped agents) keeps every invariant, and so do
//! `fence`, `data-loss`, `false-doubt` and `no-resync`, the regression tests of the bugs
//! fixed in 35edb44 (which `old-agent`, the agent before those fixes, must still break).
//! Since 9634405, `default` also lets calls under a new epoch overtake a registration's
//! resyncs (bug A), reports pools the agent has not yet checked (bug B), loses pools while
//! a Borrow is out (bug C's wide window) and lets attempts land after their call was given
//! up (bug D); the `old-registration-held`, `old-unchecked-reports` and
//! `old-unchecked-refill` scenarios undo one fix each and must break an invariant at a
//! known seed (D: `step::tests`). Since 47263b0 the bugs E and F this model found are
//! fixed too: `old-registration-adds` (`fence` with a registration's resync adding units
//! while an outcome is unknown; seed 1661) and `old-lost-listed` (`data-loss` with the
//! center listing a pool lost at held 0 in doubt; seed 2554) undo one fix each and must
//! break invariants 3 and 7 there. Since 195d94b the documented reclaim gap is closed: a
//! reclaim of a channel whose last report was not its last word puts its unreported units
//! in doubt instead of back on sale. `old-reclaim-crashed` and `old-reclaim-partitioned`
//! (`reclaim` and `partition` with the center reclaiming as before,
//! [`OldAgent::reclaim_without_last_word`]) must break invariant 3 at seeds 7 and 13,
//! where the fixed center keeps every invariant.
//!
//! The gaps the model showed in 195d94b are closed in the product, and each sweep that
//! showed one keeps every invariant:
//!
//! - `reclaim` and `partition` (bug G): a Return of units the center holds in doubt was
//!   accepted and the resolution handed them out again (invariant 1; seeds 60 and 1).
//!   Since 37a6364 the center refuses it (`ledger::give_back`) and the agent gives back
//!   nothing of a frozen or in-doubt item; `old-returns-of-doubt-crashed` and
//!   `-partitioned` ([`OldAgent::returns_of_units_in_doubt`]) must break invariant 1 at
//!   those seeds. `reclaim-returns-spare-doubt` and `partition-returns-spare-doubt` are the
//!   names these sweeps had while that refusal was only proposed in the model: the same
//!   runs now. `default` still reclaims only agents that stopped gracefully.
//! - `partition-returns-spare-doubt` over 1000 seeds: a pool lost at held 0 stayed frozen
//!   as long as its agent ran (invariant 7, seed 509). Since 37a6364 it sells again after
//!   a resync; `old-held-zero-frozen` ([`OldAgent::held_zero_stays_frozen`]) must break
//!   invariant 7 at seed 509.
//! - `loss-before-refill` (bug C's remaining window, [`Faults::loss_before_refill`]): a
//!   pool lost between `borrow_now`'s second generation check and its refill script was
//!   recreated by the refill (invariant 8). Since 4473fcb the script refuses a missing
//!   pool; `old-refill-creates` ([`OldAgent::refill_creates`]) must break invariant 8 at
//!   seed 1421.
//! - `shared-store` ([`Rivals::SharedStore`]): two processes of a channel resynced one
//!   pool store, each under its own locks (invariant 3). Since 9ffeaf6 the second one's
//!   registration fences the first one's late refills, takes and untakes;
//!   `old-unfenced-store` ([`OldAgent::unfenced_store`]) must break invariant 3 at seed 0.
//! - `shared-store` beyond its 200 tested seeds (invariant 3, seed 494): `give_back` took
//!   units under the epoch it read first, but its Return went out under the link's epoch
//!   when the call began, which a registration in between made newer; the center then
//!   accepted a Return of units another process's resync had already counted back into
//!   the pool. Since 6b4c4d3 a Borrow and a Return carry, on every attempt, the epoch read
//!   before their pool writes (the Return is refused as stale, its untake fenced);
//!   `old-return-epoch-at-send` ([`OldAgent::call_epoch_at_send`]) must break invariant 3
//!   at seed 494.
//!
//! No scenario is known to break an invariant of the fixed logic: no test is
//! `#[ignore]`d, and `shared-store`, `default` and `fence` keep every invariant over
//! seeds 0..20000 each (release build, `--seeds 20000`).
//!
//! Each switch restricts the *schedule* `default` may produce (when a task runs, when a
//! message or a data loss happens), never what the agent or the center do; only
//! [`OldAgent`] (the code before a fix) and [`Breakage`] change the rules.
//! `broken-epoch-check` and `broken-replays` break the center on purpose and must be
//! caught.

pub mod check;
pub mod rng;
pub mod step;
pub mod world;

use std::fmt;

use world::ReservationState;
pub use world::{Breakage, Config, Faults, OldAgent, Reclaims, Rivals, Stats, Violation, World};

/// How many trailing trace lines a failure shows.
pub const SHOWN_TRACE: usize = 50;

/// A named set of faults, with the test that runs it.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    pub name: &'static str,
    pub test: &'static str,
    pub config: Config,
}

/// The scenarios the tests and the binary know.
pub fn scenarios() -> Vec<Scenario> {
    let base = Config::default();
    let faults = Faults::DEFAULT;
    // Reclaims of any channel whose lease expired (as in `default`), without the faults
    // that would hide the schedule: crashes and stops; or lost heartbeats (a partition).
    let reclaim = Faults { reclaims: Reclaims::LeaseExpired, ..faults };
    let partition =
        Faults { crashes: false, stops: false, lose_heartbeat_pct: 40, reclaims: Reclaims::LeaseExpired, ..faults };
    let with = |name, test, faults| Scenario { name, test, config: Config { faults, ..base } };
    // The agent (and center) before 9634405, one fix undone at a time.
    let old = |name, test, old_agent| Scenario { name, test, config: Config { old_agent, ..base } };
    vec![
        Scenario { name: "default", test: "two_hundred_seeds_keep_every_invariant", config: base },
        with(
            "fence",
            "a_fenced_agent_with_calls_in_flight_counts_every_unit_once",
            Faults { pool_data_loss: false, ..faults },
        ),
        with("data-loss", "a_lost_pool_is_in_doubt_and_never_resold", Faults { rivals: Rivals::Never, ..faults }),
        with(
            "false-doubt",
            "units_in_doubt_only_after_data_loss",
            Faults { pool_data_loss: false, rivals: Rivals::Never, ..faults },
        ),
        Scenario {
            name: "no-resync",
            test: "drift_settles_without_a_new_registration",
            config: Config { resync_at_quiescence: false, faults: Faults { rivals: Rivals::Never, ..faults }, ..base },
        },
        with("reclaim", "a_reclaim_of_a_crashed_agent_puts_its_unreported_units_in_doubt", reclaim),
        with("partition", "a_reclaim_of_a_partitioned_agent_puts_its_unreported_units_in_doubt", partition),
        with(
            "loss-before-refill",
            "a_pool_lost_between_the_refill_check_and_the_refill",
            Faults { loss_before_refill: true, ..faults },
        ),
        with("shared-store", "two_processes_sharing_one_pool_store", Faults { rivals: Rivals::SharedStore, ..faults }),
        Scenario {
            name: "old-agent",
            test: "the_agent_before_the_fixes_is_caught",
            config: Config {
                old_agent: OldAgent { epoch_per_attempt: true, resync_ignores_lock: true, ..OldAgent::default() },
                ..base
            },
        },
        old(
            "old-registration-held",
            "a_registration_resync_reads_held_under_the_item_lock",
            OldAgent { registration_held: true, ..OldAgent::default() },
        ),
        old(
            "old-unchecked-reports",
            "a_vanished_pool_is_reported_lost_never_empty",
            OldAgent { unchecked_reports: true, ..OldAgent::default() },
        ),
        // (The agent before 9634405 did not resync a frozen item either: 37a6364's resync
        // after a lost pool makes the registration at this scenario's seed only remove.)
        old(
            "old-unchecked-refill",
            "a_pool_lost_while_a_borrow_is_out_is_not_refilled",
            OldAgent { refill_unchecked: true, held_zero_stays_frozen: true, ..OldAgent::default() },
        ),
        // The agent and center before 47263b0, one fix undone, with the faults of the
        // scenario that found the bug.
        Scenario {
            name: "old-registration-adds",
            test: "a_registration_resync_only_removes_while_an_outcome_is_unknown",
            config: Config {
                faults: Faults { pool_data_loss: false, ..faults },
                old_agent: OldAgent { registration_adds_while_unknown: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "old-lost-listed",
            test: "a_pool_lost_at_held_zero_freezes_nothing",
            config: Config {
                faults: Faults { rivals: Rivals::Never, ..faults },
                old_agent: OldAgent { lost_listed_without_units: true, ..OldAgent::default() },
                ..base
            },
        },
        // The center before 195d94b: a reclaim puts every unreported unit back on sale,
        // whether or not the agent said its last word.
        Scenario {
            name: "old-reclaim-crashed",
            test: "a_reclaim_of_a_crashed_agent_puts_its_unreported_units_in_doubt",
            config: Config {
                faults: reclaim,
                old_agent: OldAgent { reclaim_without_last_word: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "old-reclaim-partitioned",
            test: "a_reclaim_of_a_partitioned_agent_puts_its_unreported_units_in_doubt",
            config: Config {
                faults: partition,
                old_agent: OldAgent { reclaim_without_last_word: true, ..OldAgent::default() },
                ..base
            },
        },
        // `reclaim` and `partition` under the names they had while the refusal of Returns
        // of units in doubt was only proposed in the model; since 37a6364 it is the
        // product's `ledger::give_back`, so they are the same runs.
        with("reclaim-returns-spare-doubt", "a_return_of_units_in_doubt_is_refused", reclaim),
        with("partition-returns-spare-doubt", "a_pool_lost_at_held_zero_unfreezes_without_a_restart", partition),
        // The agent, center and pool store before 4473fcb, 37a6364 and 9ffeaf6, one fix
        // undone, with the faults of the scenario that shows the bug.
        Scenario {
            name: "old-refill-creates",
            test: "a_pool_lost_between_the_refill_check_and_the_refill",
            config: Config {
                faults: Faults { loss_before_refill: true, ..faults },
                old_agent: OldAgent { refill_creates: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "old-returns-of-doubt-crashed",
            test: "a_return_of_units_in_doubt_is_refused",
            config: Config {
                faults: reclaim,
                old_agent: OldAgent { returns_of_units_in_doubt: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "old-returns-of-doubt-partitioned",
            test: "a_return_of_units_in_doubt_is_refused",
            config: Config {
                faults: partition,
                old_agent: OldAgent { returns_of_units_in_doubt: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "old-held-zero-frozen",
            test: "a_pool_lost_at_held_zero_unfreezes_without_a_restart",
            config: Config {
                faults: partition,
                old_agent: OldAgent { held_zero_stays_frozen: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "old-unfenced-store",
            test: "two_processes_sharing_one_pool_store",
            config: Config {
                faults: Faults { rivals: Rivals::SharedStore, ..faults },
                old_agent: OldAgent { unfenced_store: true, ..OldAgent::default() },
                ..base
            },
        },
        // The link before 6b4c4d3: a call goes out under the epoch the link holds when it
        // begins, with the faults of the scenario that found the bug.
        Scenario {
            name: "old-return-epoch-at-send",
            test: "a_return_taken_before_another_process_fenced_the_pool",
            config: Config {
                faults: Faults { rivals: Rivals::SharedStore, ..faults },
                old_agent: OldAgent { call_epoch_at_send: true, ..OldAgent::default() },
                ..base
            },
        },
        Scenario {
            name: "broken-epoch-check",
            test: "a_center_without_the_epoch_check_is_caught",
            config: Config { breakage: Breakage { skip_epoch_check: true, ..Breakage::default() }, ..base },
        },
        Scenario {
            name: "broken-replays",
            test: "a_center_that_applies_replays_is_caught",
            config: Config { breakage: Breakage { apply_replays: true, ..Breakage::default() }, ..base },
        },
    ]
}

pub fn scenario(name: &str) -> Option<Scenario> {
    scenarios().into_iter().find(|s| s.name == name)
}

/// A run that broke an invariant.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub scenario: &'static str,
    pub step: usize,
    pub violation: Violation,
    pub trace: Vec<String>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} (scenario {}) broke {} at step {}", self.seed, self.scenario, self.violation, self.step)?;
        let from = self.trace.len().saturating_sub(SHOWN_TRACE);
        writeln!(f, "last {} of {} trace lines:", self.trace.len() - from, self.trace.len())?;
        for line in &self.trace[from..] {
            writeln!(f, "  {line}")?;
        }
        let test = scenario(self.scenario).map_or("", |s| s.test);
        write!(
            f,
            "replay: INVENTORY_SIM_SEED={} cargo test -p inventory-sim {test} -- --include-ignored\n\
             or:     cargo run -p inventory-sim -- --scenario {} --seed {} --trace",
            self.seed, self.scenario, self.seed
        )
    }
}

/// A run that kept every invariant.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub trace: Vec<String>,
    pub stats: Stats,
}

/// What runs after every step: [`check::check_step`] in real runs.
pub type Checker = fn(&World) -> Result<(), Violation>;

/// Runs one seed of a scenario to the end of its sale, checking every invariant.
pub fn run(seed: u64, scenario: &Scenario) -> Result<Outcome, Failure> {
    run_checked(seed, scenario, check::check_step)
}

/// [`run`] with another checker (e.g. [`check::check_state`], which ignores the
/// center's own bookkeeping and judges only the visible state).
pub fn run_checked(seed: u64, scenario: &Scenario, ck: Checker) -> Result<Outcome, Failure> {
    let mut w = World::new(seed, scenario.config);
    let result = play(&mut w, ck);
    match result {
        Ok(()) => Ok(Outcome { trace: w.trace, stats: w.stats }),
        Err(violation) => {
            let line = format!("VIOLATION {violation}");
            w.log(line);
            Err(Failure { seed, scenario: scenario.name, step: w.step, violation, trace: w.trace })
        }
    }
}

fn play(w: &mut World, ck: Checker) -> Result<(), Violation> {
    w.boot()?;
    ck(w)?;
    for _ in 0..w.config.steps {
        w.step += 1;
        w.random_step()?;
        ck(w)?;
    }
    quiesce(w, ck)?;
    if w.config.resync_at_quiescence {
        check::check_quiescent(w)?;
        sell_out(w, ck)
    } else {
        // Running agents kept their drift: can the stock still be sold (7)? Then 2.
        sell_out(w, ck)?;
        check::check_quiescent(w)
    }
}

/// Quiescence: everything in flight lands; agents that are down restart and running
/// agents register again and resync (unless the scenario says not to); buyers pay for
/// what they reserved; an operator resolves units in doubt.
fn quiesce(w: &mut World, ck: Checker) -> Result<(), Violation> {
    w.log("--- drain: no more faults ---".to_owned());
    w.drain(&mut |w| ck(w))?;
    for name in w.item_names() {
        for agent in w.agents.iter().filter(|a| a.mem.is_some()) {
            let in_pool = agent.pools.get(&name).map_or(0, |p| p.counts().sum());
            w.stats.drift_waiting_for_resync += w.center.held(&name, agent.name()).abs_diff(in_pool);
        }
    }
    let resync = w.config.resync_at_quiescence;
    let line = if resync { "every agent (re)starts or registers again" } else { "agents that are down restart" };
    w.log(format!("--- {line} ---"));
    for c in 0..w.agents.len() {
        w.step += 1;
        if w.agents[c].mem.is_none() {
            w.restart(c)?;
        } else if resync {
            w.register_and_resync(c)?;
        }
        ck(w)?;
    }
    w.drain(&mut |w| ck(w))?;
    // One heartbeat each: a pool found lost at registration is reported, so the center
    // puts its units in doubt.
    w.step += 1;
    w.advance(world::HEARTBEAT_EVERY_MS)?;
    ck(w)?;
    w.drain(&mut |w| ck(w))?;
    w.log("--- buyers pay for what they reserved ---".to_owned());
    for (c, item, id) in w.reservations.clone() {
        w.step += 1;
        w.finish(c, &item, &id, true)?;
        ck(w)?;
    }
    if resync {
        scheduled_resyncs(w, ck)?;
    }
    w.log("--- the operator resolves units in doubt ---".to_owned());
    w.resolve_in_doubt()?;
    ck(w)?;
    w.drain(&mut |w| ck(w))
}

/// Since 47263b0 a registration's resync only removes units from a pool while an outcome
/// of the item is unknown: what is missing is added by the per-item resync scheduled for
/// 5 s after that outcome. Time moves on (heartbeats go out) until every scheduled resync
/// is due, and the rebalancer runs each; then one more heartbeat each reports what they
/// found (a lost pool puts its units in doubt before the operator resolves them).
fn scheduled_resyncs(w: &mut World, ck: Checker) -> Result<(), Violation> {
    if w.scheduled_resyncs().is_empty() {
        return Ok(());
    }
    w.log("--- scheduled resyncs run when due ---".to_owned());
    for _ in 0..100 {
        let scheduled = w.scheduled_resyncs();
        if scheduled.is_empty() {
            w.step += 1;
            w.advance(world::HEARTBEAT_EVERY_MS)?;
            ck(w)?;
            return w.drain(&mut |w| ck(w));
        }
        let now = w.now_ms;
        let due: Vec<(usize, String)> =
            scheduled.into_iter().filter(|(_, _, at)| *at <= now).map(|(c, item, _)| (c, item)).collect();
        if due.is_empty() {
            w.step += 1;
            w.advance(world::HEARTBEAT_EVERY_MS)?;
            ck(w)?;
            continue;
        }
        for (c, item) in due {
            w.step += 1;
            w.resync_if_due(c, &item)?;
            ck(w)?;
        }
        w.drain(&mut |w| ck(w))?;
    }
    Err(Violation::new("2", format!("scheduled resyncs never ran: {:?}", w.scheduled_resyncs())))
}

/// Rounds of demand in a row that may sell nothing before stock counts as stranded. The
/// last units can bounce between starving channels for a while: each short Borrow makes
/// the center ask the others to give back, and the give-back queued on the winner's lock
/// returns the unit unless the waiting Acquire's retry gets it first (about one round in
/// four sells), so a stall is only a stall after many rounds.
pub const IDLE_ROUNDS: usize = 100;

/// The end of the sale: buyers pay for what they reserved, then demand exceeds supply on
/// every channel until every unit is sold (invariant 7). Rounds in which nothing sells
/// are counted; [`IDLE_ROUNDS`] in a row means stock is stranded.
fn sell_out(w: &mut World, ck: Checker) -> Result<(), Violation> {
    w.log("--- sell out: more buyers than units on every channel ---".to_owned());
    let items = w.item_names();
    let mut idle_rounds = 0;
    for _round in 0..2_000 {
        let before: u64 = items.iter().map(|i| check::sold(w, i)).sum();
        // Buyers of every channel arrive in an order drawn from the seed.
        let first = w.rng.index(w.agents.len());
        let n = w.agents.len();
        for c in (0..n).map(|k| (first + k) % n) {
            for item in &items {
                loop {
                    w.step += 1;
                    let n = w.reservations.len();
                    let user = w.fresh_id("buyer");
                    let key = w.fresh_id("k");
                    w.acquire(c, item, &user, 1, &key, None)?;
                    ck(w)?;
                    if w.reservations.len() == n {
                        break;
                    }
                    let (c, item, id) = w.reservations[n].clone();
                    w.step += 1;
                    w.finish(c, &item, &id, true)?;
                    ck(w)?;
                }
            }
        }
        w.drain(&mut |w| ck(w))?;
        pay_pending(w, ck)?;
        w.step += 1;
        w.advance(250)?;
        for c in 0..w.agents.len() {
            for item in &items {
                w.step += 1;
                w.rebalance(c, item)?;
                ck(w)?;
            }
        }
        w.drain(&mut |w| ck(w))?;
        pay_pending(w, ck)?;
        let sold: u64 = items.iter().map(|i| check::sold(w, i)).sum();
        w.stats.sold = sold;
        // Units ever sold: the total, plus what was written off after it was sold.
        let total: u64 = items.iter().map(|i| w.center.item(i).state.total + w.center.item(i).state.written_off).sum();
        if sold >= total {
            return Ok(());
        }
        idle_rounds = if sold > before { 0 } else { idle_rounds + 1 };
        if idle_rounds >= IDLE_ROUNDS {
            let wher: Vec<String> = items.iter().map(|i| check::whereabouts(w, i)).collect();
            return Err(Violation::new(
                "7",
                format!(
                    "{sold} of {total} units sold and {IDLE_ROUNDS} rounds of demand sold nothing more: {}",
                    wher.join(" | ")
                ),
            ));
        }
    }
    Err(Violation::new("7", "the sale did not end after 2000 rounds"))
}

/// Buyers pay for reservations still open (e.g. made by an Acquire's retry after its
/// Borrow).
fn pay_pending(w: &mut World, ck: Checker) -> Result<(), Violation> {
    let open: Vec<(usize, String, String)> = w
        .reservations
        .iter()
        .filter(|(c, item, id)| {
            w.agents[*c]
                .pools
                .get(item)
                .and_then(|p| p.reservation_state(id))
                .is_some_and(|s| s == ReservationState::Reserved)
        })
        .cloned()
        .collect();
    for (c, item, id) in open {
        w.step += 1;
        w.finish(c, &item, &id, true)?;
        ck(w)?;
    }
    Ok(())
}
