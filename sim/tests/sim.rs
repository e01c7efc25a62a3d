//! The simulator's tests: many seeds keep every invariant, a seed replays exactly, the
//! bugs fixed in commits 35edb44, 9634405, 47263b0, 195d94b, 4473fcb, 37a6364, 9ffeaf6
//! and 6b4c4d3 stay fixed (and the agent, center or pool store before each fix is
//! caught, most at the seed that showed the bug), and deliberately broken centers are
//! caught (the checker is not vacuous).
//!
//! `INVENTORY_SIM_SEEDS=<n>` sets how many seeds the seed sweeps run (default 200, or more
//! for a scenario whose former failure showed later); `INVENTORY_SIM_SEED=<n>` runs that
//! one seed only and prints its trace (`cargo test -p inventory-sim <test> --
//! --nocapture`).
//!
//! No test is `#[ignore]`d: no known scenario breaks an invariant of the fixed logic.
//! Wider sweeps (thousands of seeds) run in release with the binary: `cargo run --release
//! -p inventory-sim -- --scenario NAME --seeds N`.

use std::time::Instant;

use inventory_sim::{Failure, Scenario, Stats, check, run, run_checked, scenario};

fn seeds(default_count: u64) -> std::ops::Range<u64> {
    if let Some(seed) = env_u64("INVENTORY_SIM_SEED") {
        return seed..seed + 1;
    }
    0..env_u64("INVENTORY_SIM_SEEDS").unwrap_or(default_count)
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|e| panic!("{name}={value:?}: {e}")))
}

fn one_seed() -> bool {
    std::env::var("INVENTORY_SIM_SEED").is_ok()
}

fn named(name: &str) -> Scenario {
    scenario(name).unwrap_or_else(|| panic!("no scenario {name}"))
}

/// Runs the seeds of a scenario; the first failure, if any, and the summed stats.
fn sweep(sc: &Scenario, count: u64) -> (Option<Failure>, Stats, usize) {
    let mut total = Stats::default();
    let mut passed = 0;
    for seed in seeds(count) {
        match run(seed, sc) {
            Ok(outcome) => {
                if one_seed() {
                    for line in &outcome.trace {
                        println!("{line}");
                    }
                }
                total.add(&outcome.stats);
                passed += 1;
            }
            Err(failure) => return (Some(failure), total, passed),
        }
    }
    (None, total, passed)
}

/// Every seed of the scenario keeps every invariant, or the test fails with the seed, the
/// broken rule, the tail of the trace and how to replay it.
fn assert_seeds_pass(name: &str, count: u64) -> Stats {
    let began = Instant::now();
    let (failure, stats, passed) = sweep(&named(name), count);
    if let Some(f) = failure {
        panic!("\n{f}\n");
    }
    println!("scenario {name}: {passed} seeds kept every invariant in {:.1?}; {stats:?}", began.elapsed());
    stats
}

fn assert_every_seed_passes(name: &str) -> Stats {
    assert_seeds_pass(name, 200)
}

/// The scenario breaks the given invariant within the first seeds.
fn assert_caught(name: &str, invariant: &str) {
    let sc = named(name);
    let found = (0..200).find_map(|seed| run(seed, &sc).err());
    let Some(f) = found else { panic!("scenario {name}: no seed in 0..200 broke anything; the checker is blind") };
    assert_eq!(f.violation.invariant, invariant, "scenario {name} broke another rule than expected:\n{f}");
    assert!(f.trace.last().is_some_and(|l| l.contains("VIOLATION")), "the trace ends with the violation");
    println!("scenario {name}: caught at seed {}: {}", f.seed, f.violation);
}

#[test]
fn two_hundred_seeds_keep_every_invariant() {
    let stats = assert_every_seed_passes("default");
    if !one_seed() {
        // The faults really happened: the run is not a quiet one that proves nothing.
        assert!(stats.crashes > 0, "{stats:?}");
        assert!(stats.lost_messages > 0 && stats.late_landings > 0, "{stats:?}");
        assert!(stats.retries > 0 && stats.give_ups > 0, "{stats:?}");
        assert!(stats.replays_answered > 0, "{stats:?}");
        assert!(stats.stale_refused > 0, "stale calls reached the center: {stats:?}");
        assert!(stats.resync_moves > 0, "{stats:?}");
        assert!(stats.reclaims > 0, "reclaims of stopped agents happened: {stats:?}");
        assert!(stats.sold > 0, "{stats:?}");
        // The paths of the fixes were taken.
        assert!(stats.unknown_outcomes > 0 && stats.item_resyncs > 0, "unknown outcomes resynced: {stats:?}");
        assert!(stats.fenced_with_calls_in_flight > 0, "re-registrations with calls in flight: {stats:?}");
        assert!(stats.stale_refused_own > 0, "calls begun before a re-registration refused: {stats:?}");
        assert!(stats.resyncs_waiting_for_a_call > 0, "resyncs waited for the call in flight: {stats:?}");
        assert!(stats.pools_opened > 0, "{stats:?}");
        assert!(stats.pool_losses_unrecorded > 0, "pools lost before a generation was recorded: {stats:?}");
        assert!(stats.resolutions > 0 && stats.resolutions_without_data_loss == 0, "{stats:?}");
        // The schedules of bugs A, B and C (wide window) happen in `default` now.
        assert!(stats.registration_held_moved > 0, "calls overtook a registration: {stats:?}");
        assert!(stats.pool_losses_during_borrow > 0 && stats.refills_withheld > 0, "{stats:?}");
        // ... and of E and F (47263b0).
        assert!(stats.registration_adds_withheld > 0, "registrations only removed while unknown: {stats:?}");
        assert!(stats.lost_pools_without_units > 0, "pools lost at held 0 froze nothing: {stats:?}");
        // ... and of the Return sent after a re-registration (6b4c4d3).
        assert!(stats.calls_sent_under_their_pool_epoch > 0, "calls kept their pool epoch: {stats:?}");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let seed = env_u64("INVENTORY_SIM_SEED").unwrap_or(7);
    let sc = named("default");
    let (a, b) = (run(seed, &sc), run(seed, &sc));
    let trace = |r: &Result<inventory_sim::Outcome, Failure>| match r {
        Ok(o) => o.trace.clone(),
        Err(f) => f.trace.clone(),
    };
    assert!(trace(&a).len() > 300, "a run is a few hundred steps");
    assert_eq!(trace(&a), trace(&b));
    // A failing seed replays to the same failure, step for step.
    let broken = named("broken-replays");
    let (x, y) = (run(0, &broken).unwrap_err(), run(0, &broken).unwrap_err());
    assert_eq!((x.step, &x.violation, &x.trace), (y.step, &y.violation, &y.trace));
    // Another seed is another run.
    assert_ne!(trace(&run(seed + 1, &sc)), trace(&a));
}

#[test]
fn a_center_without_the_epoch_check_is_caught() {
    assert_caught("broken-epoch-check", "6");
}

#[test]
fn a_center_that_applies_replays_is_caught() {
    assert_caught("broken-replays", "4");
}

/// Even without the reference model's bookkeeping (counts of applications, stale
/// epochs), the damage a broken center does shows in the state: units counted twice.
#[test]
fn broken_centers_do_visible_damage() {
    for name in ["broken-epoch-check", "broken-replays"] {
        let sc = named(name);
        // Resyncs that read the center's view under the lock repair much of a broken
        // center's damage before it shows: the search goes further than 200 seeds.
        let found = (0..2_000).find_map(|seed| run_checked(seed, &sc, check::check_state).err());
        let Some(f) = found else { panic!("scenario {name}: no visible damage in seeds 0..2000") };
        assert_eq!(f.violation.invariant, "3", "{f}");
        println!("scenario {name}: visible at seed {}: {}", f.seed, f.violation);
    }
}

// ---------------------------------------------------------------------------------------
// Former known bugs, fixed in commit 35edb44: regression tests
// ---------------------------------------------------------------------------------------

/// Was `fenced_agent_with_calls_in_flight` (invariant 3, seed 19): a Borrow/Return begun
/// before a re-registration was re-sent under the new epoch and landed after the resync.
/// Now every attempt carries the epoch of the first (refused as stale after the
/// re-registration, or a replay of what the registration's `held` already counts), and
/// the resync waits for the call under the item's lock.
#[test]
fn a_fenced_agent_with_calls_in_flight_counts_every_unit_once() {
    let stats = assert_every_seed_passes("fence");
    if !one_seed() {
        assert!(stats.fenced_with_calls_in_flight > 0, "{stats:?}");
        assert!(stats.stale_refused_own > 0, "{stats:?}");
        assert!(stats.resyncs_waiting_for_a_call > 0, "{stats:?}");
    }
}

/// Was `pool_data_loss` (invariant 8, seed 199): a pool lost before the agent recorded its
/// generation and then recreated by a refill went unnoticed. Now the pool is created (and
/// its generation recorded) before the first Borrow, and a missing pool while the center
/// counts units held means data loss: the units are in doubt until resolved.
#[test]
fn a_lost_pool_is_in_doubt_and_never_resold() {
    let stats = assert_every_seed_passes("data-loss");
    if !one_seed() {
        assert!(stats.pool_losses_unrecorded > 0 && stats.pools_opened > 0, "{stats:?}");
        assert!(stats.resolutions > 0 && stats.resolutions_without_data_loss == 0, "{stats:?}");
    }
}

/// Was the known bug of the same name (invariant 7, seed 0): a crash between the first
/// Borrow's grant and its refill left no pool (generation 0) while the center counted
/// units held, which the resync took for a lost pool. Now pools exist before their first
/// Borrow, so without data loss nothing is ever in doubt.
#[test]
fn units_in_doubt_only_after_data_loss() {
    let stats = assert_every_seed_passes("false-doubt");
    if !one_seed() {
        assert!(stats.crashes > 0 && stats.pools_opened > 0, "{stats:?}");
        assert_eq!(stats.resolutions, 0, "{stats:?}");
    }
}

/// Was `drift_without_a_resync` (invariants 2 and 7, seed 0): a Borrow or Return with an
/// unknown outcome left drift that only a new registration settled. Now the agent resyncs
/// the item 5 s later (DescribeItem's `held`), so without any re-registration (no second
/// processes, none at quiescence) every unit still ends up where the center says.
#[test]
fn drift_settles_without_a_new_registration() {
    let stats = assert_every_seed_passes("no-resync");
    if !one_seed() {
        assert!(stats.unknown_outcomes > 0 && stats.item_resyncs > 0, "{stats:?}");
        assert_eq!(stats.fenced_reregistrations, 0, "{stats:?}");
    }
}

/// The agent as it was before commit 35edb44 (the epoch read again on every attempt, the
/// registration's resync not waiting for the call in flight) still breaks invariant 3
/// here: the model sees the bugs the fixes removed.
#[test]
fn the_agent_before_the_fixes_is_caught() {
    assert_caught("old-agent", "3");
}

// ---------------------------------------------------------------------------------------
// Former bug G and the held-zero gap, fixed in commit 37a6364: regression tests
// ---------------------------------------------------------------------------------------

/// Was bug G (found by mirroring 195d94b; invariant 1): `ledger::give_back` only checked
/// `held`, so a Return of units the center holds in doubt was accepted, and
/// `resolve_in_doubt` (which since 195d94b settles `in_doubt`, not `held`) then handed the
/// same units out again (returned + reclaimed exceeds granted; then 3). With reclaims of
/// crashed agents the units are in doubt while the pool is intact (`held_in_doubt`): seed
/// 60, app was reclaimed without its last word (4 units of bundle in doubt), registered
/// again (`held_in_doubt`, pool kept 4/0/0), then stopped gracefully; `return_all` took
/// the 4 units and the center accepted the Return; the operator then resolved app/bundle
/// with 0 sold and the center put the 4 units back on sale once more. Since 37a6364
/// `ledger::give_back` (the real one, which the model calls) refuses units in doubt, and
/// the agent gives back nothing of a frozen or in-doubt item: reclaims of crashed agents
/// keep every invariant ([`a_return_of_units_in_doubt_is_refused`] shows the old rules
/// still break at that seed).
#[test]
fn reclaims_of_crashed_agents_keep_every_invariant() {
    assert_every_seed_passes("reclaim");
}

/// Bug G for a partitioned agent: seed 1, app (reclaimed without its last word while its
/// heartbeats were lost; 7 units of bundle in doubt) heard it was fenced, registered again
/// and kept its pool (`held_in_doubt`), and its rebalancer, above the high watermark, gave
/// back the 7 units (accepted before 37a6364); the operator's resolution put them back on
/// sale a second time. Fixed as above.
#[test]
fn reclaims_of_partitioned_agents_keep_every_invariant() {
    assert_every_seed_passes("partition");
}

/// Bug G at the seeds that showed it: `old-returns-of-doubt-crashed` and
/// `-partitioned` (the ledger's arithmetic before 37a6364, checking only `held`, and an
/// agent that gives back units of frozen or in-doubt items) break invariant 1 at seeds 60
/// and 1; the product's rules keep every invariant there. (`reclaim-returns-spare-doubt`
/// and `partition-returns-spare-doubt` are the names `reclaim` and `partition` had while
/// this refusal was only proposed in the model; they are the same runs now.)
#[test]
fn a_return_of_units_in_doubt_is_refused() {
    let stats = fixed_at(60, "reclaim-returns-spare-doubt", "old-returns-of-doubt-crashed", "1");
    assert!(stats.reclaims_into_doubt > 0 && stats.resolutions_after_reclaim > 0, "{stats:?}");
    assert!(stats.held_in_doubt > 0, "{stats:?}");
    fixed_at(1, "partition-returns-spare-doubt", "old-returns-of-doubt-partitioned", "1");
}

/// Was a known gap (invariant 7, seed 509 of `partition-returns-spare-doubt`, found once
/// bug G was out of the way; `partition` has no crashes or stops, so agents run for the
/// whole sale): an agent that noticed its store lost a pool while the channel held none
/// of it froze the item (`pool_lost`), and nothing unfroze it while the process lived:
/// nothing was in doubt, so no resolution came, and a registration's resync of a pool at
/// `held 0` aligned it without clearing `frozen`. At seed 509 web's and app's skin pools
/// were lost at held 0 and the 75 units of skin stayed at the center, unsold. Since
/// 37a6364 `pool_lost` schedules a resync 1 s later, and a resync that finds `held 0`
/// with nothing in doubt unfreezes the item and sells again from whatever the store has
/// (aligned to nothing). `old-held-zero-frozen` (the agent before it) still breaks
/// invariant 7 at seed 509.
#[test]
fn a_pool_lost_at_held_zero_unfreezes_without_a_restart() {
    fixed_at(509, "partition-returns-spare-doubt", "old-held-zero-frozen", "7");
    let stats = assert_seeds_pass("partition-returns-spare-doubt", 1_000);
    if !one_seed() {
        assert!(stats.unfrozen_at_held_zero > 0, "frozen items were put back on sale: {stats:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Former known bugs A, B, C (its wide window) and D, fixed in commit 9634405: regression
// tests (D's is scripted, in `step::tests`)
// ---------------------------------------------------------------------------------------

/// One seed of a scenario (`fixed`) must keep every invariant; the same seed with one fix
/// undone (`old`, the same faults) must break `invariant`: the model still sees the bug.
/// Returns the stats of the fixed run.
fn fixed_at(seed: u64, fixed: &str, old: &str, invariant: &str) -> Stats {
    let began = Instant::now();
    let f = run(seed, &named(old)).expect_err("the agent without the fix is caught");
    assert_eq!(f.violation.invariant, invariant, "{f}");
    let outcome = run(seed, &named(fixed)).unwrap_or_else(|f| panic!("\n{f}\n"));
    println!(
        "seed {seed}: {old} breaks {}; the fixed agent keeps every invariant in {fixed} ({:.1?})",
        f.violation,
        began.elapsed()
    );
    outcome.stats
}

/// Was bug A, `calls_overtaking_a_registration_resync` (invariant 3, seed 12): a
/// registration's resync used the `held` the registration answered, though calls begun
/// under the new epoch (a Return taken before the registration and sent after it, tasks
/// queued on the lock, the rebalancer and watcher, which keep running) had changed it
/// since. Now each item's resync reads DescribeItem under the item's lock; `default` lets
/// those calls overtake the registration (they used to be held back by a switch).
#[test]
fn a_registration_resync_reads_held_under_the_item_lock() {
    fixed_at(12, "default", "old-registration-held", "3");
}

/// Was bug B, `a_lost_pool_reported_before_it_is_noticed` (invariant 8, seed 511 of its
/// scenario; seed 66 with only this fix undone): a pool the store lost went out in a
/// report (heartbeat, final report of a stop) as generation 0, 0/0/0, which the center
/// took for an empty pool (a reclaim then took back units the lost pool had sold). Now
/// `reports` runs the generation check first and reports such a pool `lost`, and the
/// center takes a generation-0 report after a non-zero one for a lost pool; `default`
/// reports pools whatever the rebalancer has noticed (it used to be a switch).
#[test]
fn a_vanished_pool_is_reported_lost_never_empty() {
    fixed_at(66, "default", "old-unchecked-reports", "8");
}

/// Was bug C's wide window, `a_pool_lost_while_a_borrow_is_in_flight` (invariants 8 and
/// 7, seeds 74 and 991): a Borrow's refill recreated a pool lost while the call was out.
/// Now `borrow_now` checks the generation again once the grant is in and leaves a lost
/// pool alone (the units fall in doubt); `default` loses pools while Borrows are out.
/// What is left of C is [`a_pool_lost_between_the_refill_check_and_the_refill`].
#[test]
fn a_pool_lost_while_a_borrow_is_out_is_not_refilled() {
    fixed_at(991, "default", "old-unchecked-refill", "8");
}

// ---------------------------------------------------------------------------------------
// Former known bugs E and F, fixed in commit 47263b0: regression tests
// ---------------------------------------------------------------------------------------

/// Was bug E, `a_registration_resync_right_after_a_call_gave_up` (invariant 3, seed 1661
/// of scenario `fence`): the registration's resync, like `resync_item` before the fix of
/// D, could run right after a call it waited for on the item's lock gave up, before that
/// call's last attempt landed. web was fenced and registered again (epoch 3) while its
/// Return t97 of 6 units was out; the Return gave up (a resync scheduled 5 s later); the
/// registration's resync got the lock, read `held 12` (the Return had not landed) and
/// refilled the 6 taken units; then attempt 5 landed and the center took them back: 6
/// units existed twice until the `resync_item` 5 s later. Now, while an item's resync is
/// scheduled (`resync_pending`), a registration's resync only removes units (target
/// `min(held, pool)`), leaving what is missing to `resync_item`, which runs once the call
/// can no longer land. `old-registration-adds` (scenario `fence` with the registration
/// adding as before) first breaks at this very seed.
#[test]
fn a_registration_resync_only_removes_while_an_outcome_is_unknown() {
    let stats = fixed_at(1661, "fence", "old-registration-adds", "3");
    assert!(stats.registration_adds_withheld > 0, "the registration left the units out: {stats:?}");
    assert!(stats.item_resyncs > 0, "the scheduled resync added them later: {stats:?}");
}

/// Was bug F, `a_pool_lost_at_held_zero_is_not_frozen_for_good` (invariant 7, seed 2554
/// of scenario `data-loss`): a pool the store lost while its channel held none of it,
/// reported with generation 0 after a non-zero one, was marked lost; `mark_lost` put
/// nothing in doubt, but the heartbeat answer listed the item in `in_doubt_items` anyway,
/// so the agent froze it for good (no units in doubt, so no `ResolveInDoubt` and no
/// `InDoubtResolved`). Both channels' bundle pools were lost at held 0 and its 15 units
/// stayed at the center, unsellable. Now the center lists a lost item only if
/// `mark_lost` put units in doubt. `old-lost-listed` (scenario `data-loss` with the
/// center listing every lost item) first breaks at this very seed.
#[test]
fn a_pool_lost_at_held_zero_freezes_nothing() {
    let stats = fixed_at(2554, "data-loss", "old-lost-listed", "7");
    assert!(stats.lost_pools_without_units > 0, "pools were lost at held 0: {stats:?}");
}

// ---------------------------------------------------------------------------------------
// The documented reclaim gap, fixed in commit 195d94b: regression tests
// ---------------------------------------------------------------------------------------

/// Was `reclaim_of_a_crashed_agent` (invariant 3, seed 7): a reclaim took back `held -
/// reported(reserved+sold)` of a crashed agent, though it had reserved or sold more after
/// its last report, and put those units back on sale. Now a reclaim puts them back on sale
/// only if the last report was the agent's last word (`last_report`, sent by a drain);
/// otherwise they go in doubt (`reclaim_into_doubt`), the agent sells nothing of the item
/// (`held_in_doubt`) and the operator settles them. `old-reclaim-crashed` (the center
/// reclaiming as before) still breaks invariant 3 at this seed. (The whole sweep still
/// breaks: [`reclaims_of_crashed_agents_keep_every_invariant`], bug G.)
#[test]
fn a_reclaim_of_a_crashed_agent_puts_its_unreported_units_in_doubt() {
    let stats = fixed_at(7, "reclaim", "old-reclaim-crashed", "3");
    assert!(stats.reclaims_into_doubt > 0 && stats.resolutions_after_reclaim > 0, "{stats:?}");
}

/// Was `reclaim_of_a_partitioned_agent` (invariant 3, seed 1): an agent whose heartbeats
/// were lost sold until its own lease ended, and the reclaim put what it sold after its
/// last successful report back on sale. Seed 13 (seed 1 now breaks bug G instead, see
/// [`reclaims_of_partitioned_agents_keep_every_invariant`]): `old-reclaim-partitioned`
/// breaks invariant 3, the fixed center keeps every invariant.
#[test]
fn a_reclaim_of_a_partitioned_agent_puts_its_unreported_units_in_doubt() {
    let stats = fixed_at(13, "partition", "old-reclaim-partitioned", "3");
    assert!(stats.reclaims_into_doubt > 0 && stats.resolutions_after_reclaim > 0, "{stats:?}");
}

// ---------------------------------------------------------------------------------------
// Former known bug C's remaining window (fixed in 4473fcb) and the shared pool store
// (fixed in 9ffeaf6): regression tests
// ---------------------------------------------------------------------------------------

/// Was bug C's remaining window (invariant 8; seed 61 with the agent of 195d94b): the
/// second generation check of `borrow_now` is a snapshot taken before the refill script,
/// and the script created a pool that did not exist, so a store losing the pool between
/// the two (`Faults::loss_before_refill`) had the refill recreate it under a new
/// generation, and a later registration's resync aligned the new pool with `held`: the
/// units the lost pool had sold existed twice. Since 4473fcb a grant is refilled with
/// `refill_existing`, whose script checks inside itself that the pool exists and
/// otherwise answers `PoolMissing` without recording anything; the agent freezes the item
/// and the units fall in doubt. Only the `open-` refill of 0 before the first Borrow
/// creates a pool. `old-refill-creates` (the creating refill) first breaks at seed 1421
/// now (at 61 the agent of 37a6364 no longer gives back the frozen item's units, which
/// that run needed).
#[test]
fn a_pool_lost_between_the_refill_check_and_the_refill() {
    let stats = assert_every_seed_passes("loss-before-refill");
    if !one_seed() {
        assert!(stats.refills_of_missing_pools > 0, "losses in the window were refused: {stats:?}");
    }
    fixed_at(1421, "loss-before-refill", "old-refill-creates", "8");
}

/// Was a known gap (invariant 3, seed 0): two processes of one channel that both believe
/// they lead (a deploy overlapping the old process) share a pool store. The new process's
/// registration resyncs the shared pools under its own locks, which the old process's
/// calls do not take: a grant the old process had not yet added was added by the resync
/// and then by the old process's refill, and a Return it took was refilled by the resync,
/// then refused as stale and put back. Since 9ffeaf6 every pool has a fence: a
/// registration raises it to its epoch before it reads the pool, and `refill`,
/// `refill_existing`, `take_for_return` and `untake` carrying an older epoch are refused
/// (`Fenced`, nothing moved): the old process's late refill is left to the new
/// incarnation's resync, and its untake is ignored. `old-unfenced-store` (a store
/// without fences) still breaks invariant 3 at seed 0.
#[test]
fn two_processes_sharing_one_pool_store() {
    let stats = assert_every_seed_passes("shared-store");
    if !one_seed() {
        assert!(stats.fences_raised > 0 && stats.store_calls_fenced > 0, "{stats:?}");
    }
    fixed_at(0, "shared-store", "old-unfenced-store", "3");
}

// ---------------------------------------------------------------------------------------
// A Return sent under a later epoch than its take (found after 9ffeaf6, fixed in
// 6b4c4d3): regression test
// ---------------------------------------------------------------------------------------

/// Was a known gap (invariant 3, seed 494 of `shared-store`, beyond its 200 tested seeds):
/// `give_back` read the epoch before its take and carried it to `take_for_return` and
/// `untake`, but the Return itself went out under the epoch the link held when the call
/// began (`CenterLink::retry` read it), which a registration in between made newer. At
/// seed 494 app (epoch 2) took 16 units of skin for a Return (the take passed: fence 2);
/// before the Return was sent, a second app process registered (epoch 3), fenced the
/// pool, read `held 18` (the Return had not landed) and refilled the 16 units; app heard
/// it was fenced and registered again (epoch 4), its resync of skin waiting for the lock
/// the Return held; the Return then went out under epoch 4 and the center accepted it: 16
/// units were both back at the center and available in the pool. Since 6b4c4d3 a Borrow
/// is sent under the epoch read before its pool writes and a Return under the epoch read
/// before its take (`CenterLink::borrow`/`give_back` take it; `retry` no longer reads the
/// link's), on every attempt: at seed 494 the Return goes out under epoch 2, is refused
/// as stale, its untake is fenced, and the units stay counted once, by the resync.
/// `old-return-epoch-at-send` (the link before 6b4c4d3) still breaks invariant 3 there.
#[test]
fn a_return_taken_before_another_process_fenced_the_pool() {
    let stats = fixed_at(494, "shared-store", "old-return-epoch-at-send", "3");
    assert!(stats.calls_sent_under_their_pool_epoch > 0, "the Return kept its take's epoch: {stats:?}");
    assert!(stats.stale_refused_own > 0 && stats.store_calls_fenced > 0, "refused, untake fenced: {stats:?}");
}
