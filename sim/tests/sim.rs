//! The simulator's tests: every scenario keeps every invariant over many seeds (200 by
//! default; `INVENTORY_SIM_SEEDS=<n>` for more) and at the seeds that once broke an
//! invariant, a seed replays exactly, and deliberately broken centers are caught (the
//! checker is not vacuous). `INVENTORY_SIM_SEED=<n>` runs that one seed of each sweep and
//! prints its trace (`-- --nocapture`). Wider sweeps run in release with the binary:
//! `cargo run --release -p inventory-sim -- --scenario NAME --seeds N`.

use std::time::Instant;

use inventory_sim::{Failure, Scenario, Stats, check, run, run_checked, scenario};

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|e| panic!("{name}={value:?}: {e}")))
}

fn one_seed() -> Option<u64> {
    env_u64("INVENTORY_SIM_SEED")
}

fn named(name: &str) -> Scenario {
    scenario(name).unwrap_or_else(|| panic!("no scenario {name}"))
}

/// Every seed of the sweep, then every regression seed of the scenario, keeps every
/// invariant; or the test fails with the seed, the broken rule, the tail of the trace and
/// how to replay it. Returns the summed stats.
fn assert_scenario_passes(name: &str) -> Stats {
    let sc = named(name);
    let began = Instant::now();
    let seeds: Vec<u64> = match one_seed() {
        Some(seed) => vec![seed],
        None => (0..env_u64("INVENTORY_SIM_SEEDS").unwrap_or(200)).chain(sc.regression_seeds.iter().copied()).collect(),
    };
    let mut total = Stats::default();
    for &seed in &seeds {
        match run(seed, &sc) {
            Ok(outcome) => {
                if one_seed().is_some() {
                    for line in &outcome.trace {
                        println!("{line}");
                    }
                }
                total.add(&outcome.stats);
            }
            Err(f) => panic!("\n{f}\n"),
        }
    }
    println!("scenario {name}: {} seeds kept every invariant in {:.1?}; {total:?}", seeds.len(), began.elapsed());
    total
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
fn default_keeps_every_invariant() {
    let stats = assert_scenario_passes("default");
    if one_seed().is_none() {
        // The faults really happened: the run is not a quiet one that proves nothing.
        assert!(stats.crashes > 0 && stats.pool_losses > 0, "{stats:?}");
        // Quiet heartbeats reported pools from their stamps, also pools lost with their
        // hash left (the loss told later, within the bound).
        assert!(stats.pool_losses_hash_left > 0 && stats.quiet_reports > 0, "{stats:?}");
        assert!(stats.quiet_reports_of_lost_pools > 0, "{stats:?}");
        // Looks decided from the last whole look while the stamp stood, also at pools lost
        // with their hash left.
        assert!(stats.quiet_looks > 0 && stats.quiet_looks_of_lost_pools > 0, "{stats:?}");
        // Refills were answered with the pool as they left it (and, every third step, not).
        assert!(stats.write_answers > 0, "{stats:?}");
        assert!(stats.lost_messages > 0 && stats.retries > 0 && stats.give_ups > 0, "{stats:?}");
        assert!(stats.replays_answered > 0 && stats.stale_refused > 0, "{stats:?}");
        assert!(stats.shared_borrows > 0, "short borrows shared by sell rate: {stats:?}");
        assert!(stats.reclaims > 0 && stats.sold > 0, "{stats:?}");
        // The center's database stopped, and calls waiting for it were applied when it
        // came back; calls of unknown outcome were answered for by their replays.
        assert!(stats.outages > 0 && stats.applied_after_outage > 0, "{stats:?}");
        assert!(stats.settled_by_replay > 0, "calls settled by replay: {stats:?}");
        // Pool stores at their memory limit refused stocking writes; a grant they refused
        // went back to the center.
        assert!(stats.store_writes_refused > 0 && stats.grants_given_back > 0, "{stats:?}");
        // The rules' paths were taken.
        assert!(stats.unknown_outcomes > 0 && stats.item_resyncs > 0, "unknown outcomes resynced: {stats:?}");
        assert!(stats.fenced_with_calls_in_flight > 0 && stats.stale_refused_own > 0, "{stats:?}");
        assert!(stats.resyncs_waiting_for_a_call > 0, "resyncs queued behind a call: {stats:?}");
        assert!(stats.pools_opened > 0 && stats.pool_losses_unrecorded > 0, "{stats:?}");
        assert!(stats.resolutions > 0 && stats.resolutions_without_data_loss == 0, "{stats:?}");
        assert!(stats.pool_losses_during_borrow > 0 && stats.refills_withheld > 0, "{stats:?}");
        assert!(stats.lost_pools_without_units > 0 && stats.unfrozen > 0, "{stats:?}");
        assert!(stats.calls_sent_under_their_pool_epoch > 0, "calls kept their pool epoch: {stats:?}");
        // Scheduled items opened, moved, closed early and by their end; agents answered
        // NOT_STARTED and stocked during the lead.
        assert!(stats.openings > 0 && stats.reschedules > 0 && stats.early_closes > 0, "{stats:?}");
        assert!(stats.closes_by_schedule > 0 && stats.not_started_answers > 0 && stats.prestocks > 0, "{stats:?}");
        // Items had channel shares, and their caps, floors or openings held Borrows back.
        assert!(stats.items_with_shares > 0 && stats.planned_borrows > 0, "{stats:?}");
    }
}

/// A ledger rolled back to an earlier state: the center's drift rule re-learns the lost
/// grants, nothing is sold beyond the total by more than the rollbacks lost, and an epoch
/// the rolled-back ledger hands out again below or at the pools' fence is never used: the
/// agent registers again above it.
#[test]
fn ledger_rollback_keeps_every_invariant() {
    let total = assert_scenario_passes("ledger-rollback");
    if one_seed().is_none() {
        assert!(total.ledger_rollbacks > 0 && total.units_lost_by_rollbacks > 0, "{total:?}");
        assert!(total.relearns > 0 && total.units_relearned > 0, "the center re-learned lost grants: {total:?}");
        assert!(total.epochs_reused_by_rollbacks > 0 && total.registrations_above_fence > 0, "{total:?}");
    }
}

/// Ledger and pool stores going back in the same runs. Known to break in two ways, both
/// rare:
/// - where a pool lost writes and a rolled-back ledger forgot the mark that froze it: an
///   intact pool the agent keeps in doubt while the center no longer holds anything of it
///   in doubt stalls the sale (invariant 7; nothing is sold twice);
/// - where the ledger went back to an epoch of an incarnation that has since crashed with
///   a Return in flight: the center takes that Return as the channel's current one, after
///   the next incarnation's resync put the units back on the shelf (invariant 3: units
///   exist twice). A ledger that goes back hands epochs out again; its calls' fences are
///   in the pools, not in the ledger.
///
/// Every failure must be one of those; the seeds that once broke otherwise keep every
/// invariant.
#[test]
fn ledger_and_pool_rollbacks_break_only_by_known_gaps() {
    let sc = named("ledger-pool-rollback");
    let mut total = Stats::default();
    let mut known = Vec::new();
    let seeds = env_u64("INVENTORY_SIM_SEEDS").unwrap_or(200);
    for seed in 0..seeds {
        match run(seed, &sc) {
            Ok(outcome) => total.add(&outcome.stats),
            Err(f) => {
                let pool_lost_writes = f.trace.iter().any(|l| {
                    l.contains("goes back to its snapshot") || l.contains("loses its data") || l.contains("lost: true")
                });
                let frozen = f.violation.invariant == "7" && pool_lost_writes && f.violation.detail.contains("InDoubt");
                let dead_return = f.violation.invariant == "3"
                    && f.violation.detail.contains("exist twice")
                    && dead_return_after_ledger_went_back(&f.trace);
                assert!(frozen || dead_return, "another failure than the two known gaps of a rolled-back ledger:\n{f}");
                known.push(seed);
            }
        }
    }
    for &seed in sc.regression_seeds {
        if let Err(f) = run(seed, &sc) {
            panic!("\n{f}\n");
        }
    }
    println!("ledger-pool-rollback: known gaps at seeds {known:?}; {total:?}");
    assert!(known.len() * 50 <= usize::try_from(seeds).unwrap_or(usize::MAX), "more than 2 %: {known:?}");
    assert!(total.ledger_rollbacks > 0 && total.pool_rollbacks > 0, "{total:?}");
    assert!(total.registrations_above_fence > 0, "{total:?}");
}

/// Whether, in `trace`, an incarnation crashed, the ledger then went back, and after both
/// the center applied a Return of an epoch older than one the channel had registered with
/// since (the epoch handed out again by the ledger that went back).
fn dead_return_after_ledger_went_back(trace: &[String]) -> bool {
    let Some(crash) = trace.iter().position(|l| l.contains(" crashes (")) else { return false };
    let Some(back) = trace.iter().skip(crash).position(|l| l.contains("the ledger goes back")) else { return false };
    let epoch_after = |l: &str, marker: &str| -> Option<u64> {
        let rest = &l[l.find(marker)? + marker.len()..];
        rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
    };
    let mut registered: std::collections::BTreeMap<String, u64> = Default::default();
    for (i, l) in trace.iter().enumerate() {
        if let Some(epoch) = epoch_after(l, " registers: epoch ") {
            // "web registers: …" or "a second web process registers: …"
            let head = &l[..l.find(" registers: ").unwrap_or(0)];
            let channel = head.trim_end_matches(" process").rsplit(' ').next().unwrap_or("").to_owned();
            let top = registered.entry(channel).or_default();
            *top = (*top).max(epoch);
        }
        if i > crash + back && l.contains("center: return ") && l.contains("-> Return {") {
            let channel = l.split("center: return ").nth(1).and_then(|r| r.split('/').next()).unwrap_or("");
            let applied = epoch_after(l, " epoch ");
            if applied.zip(registered.get(channel)).is_some_and(|(e, top)| e < *top) {
                return true;
            }
        }
    }
    false
}

#[test]
fn bounded_keeps_every_invariant() {
    let stats = assert_scenario_passes("bounded");
    if one_seed().is_none() {
        assert!(stats.crashes > 0 && stats.pool_losses > 0, "{stats:?}");
        // Quiet heartbeats reported pools from their stamps, also pools lost with their
        // hash left (the loss told later, within the bound).
        assert!(stats.pool_losses_hash_left > 0 && stats.quiet_reports > 0, "{stats:?}");
        assert!(stats.quiet_reports_of_lost_pools > 0, "{stats:?}");
        // Looks decided from the last whole look while the stamp stood, also at pools lost
        // with their hash left.
        assert!(stats.quiet_looks > 0 && stats.quiet_looks_of_lost_pools > 0, "{stats:?}");
        // Refills were answered with the pool as they left it (and, every third step, not).
        assert!(stats.write_answers > 0, "{stats:?}");
        assert!(stats.lost_messages > 0 && stats.late_landings > 0, "{stats:?}");
        assert!(stats.retries > 0 && stats.give_ups > 0, "{stats:?}");
        assert!(stats.outages == 0, "{stats:?}");
        if stats.registration_held_moved == 0 {
            // Calls overtaking a registration come about once in a few hundred seeds, so
            // whether the sweep's seeds hold one moves with any change of the rules: look
            // further for a seed that does (and keeps every invariant there too).
            let sc = named("bounded");
            let found = (200..2_000).find(|seed| match run(*seed, &sc) {
                Ok(o) => o.stats.registration_held_moved > 0,
                Err(f) => panic!("\n{f}\n"),
            });
            assert!(found.is_some(), "no seed up to 2,000 had calls overtake a registration: {stats:?}");
        }
    }
}

#[test]
fn fence_keeps_every_invariant() {
    let stats = assert_scenario_passes("fence");
    if one_seed().is_none() {
        assert!(stats.fenced_with_calls_in_flight > 0 && stats.stale_refused_own > 0, "{stats:?}");
    }
}

#[test]
fn data_loss_keeps_every_invariant() {
    let stats = assert_scenario_passes("data-loss");
    if one_seed().is_none() {
        assert!(stats.pool_losses_unrecorded > 0 && stats.lost_pools_without_units > 0, "{stats:?}");
        assert!(stats.resolutions > 0 && stats.resolutions_without_data_loss == 0, "{stats:?}");
    }
}

#[test]
fn false_doubt_keeps_every_invariant() {
    let stats = assert_scenario_passes("false-doubt");
    if one_seed().is_none() {
        assert!(stats.crashes > 0 && stats.pools_opened > 0, "{stats:?}");
        assert_eq!(stats.resolutions, 0, "nothing in doubt without data loss: {stats:?}");
    }
}

#[test]
fn no_resync_keeps_every_invariant() {
    let stats = assert_scenario_passes("no-resync");
    if one_seed().is_none() {
        assert!(stats.unknown_outcomes > 0 && stats.item_resyncs > 0, "{stats:?}");
        assert_eq!(stats.fenced_reregistrations, 0, "{stats:?}");
    }
}

#[test]
fn reclaim_keeps_every_invariant() {
    let stats = assert_scenario_passes("reclaim");
    if one_seed().is_none() {
        assert!(stats.reclaims_into_doubt > 0 && stats.resolutions_after_reclaim > 0, "{stats:?}");
        assert!(stats.held_in_doubt > 0 || stats.frozen_by_center > 0, "{stats:?}");
    }
}

#[test]
fn watch_lag_keeps_every_invariant() {
    let stats = assert_scenario_passes("watch-lag");
    if one_seed().is_none() {
        // Streams fell behind with events unheard, and every invariant held.
        assert!(stats.watch_lags > 0 && stats.events_missed > 0, "{stats:?}");
    }
}

#[test]
fn partition_keeps_every_invariant() {
    let stats = assert_scenario_passes("partition");
    if one_seed().is_none() {
        assert!(stats.reclaims_into_doubt > 0 && stats.resolutions_after_reclaim > 0, "{stats:?}");
    }
}

#[test]
fn loss_before_refill_keeps_every_invariant() {
    let stats = assert_scenario_passes("loss-before-refill");
    if one_seed().is_none() {
        assert!(stats.refills_of_missing_pools > 0, "losses in the refill window were refused: {stats:?}");
    }
}

#[test]
fn shared_store_keeps_every_invariant() {
    let stats = assert_scenario_passes("shared-store");
    if one_seed().is_none() {
        assert!(stats.fences_raised > 0 && stats.store_calls_fenced > 0, "{stats:?}");
    }
}

/// The seeds that once broke an invariant, each in the scenario that found it (also run
/// by that scenario's sweep): a lost heartbeat, a late attempt, a stale call or a data
/// loss landing in the window a fix closed.
#[test]
fn regression_seeds_keep_every_invariant() {
    let mut ran = 0;
    for sc in inventory_sim::scenarios() {
        for &seed in sc.regression_seeds {
            if let Err(f) = run(seed, &sc) {
                panic!("\n{f}\n");
            }
            ran += 1;
        }
    }
    assert!(ran >= 20, "{ran} regression seeds");
}

#[test]
fn a_seed_replays_exactly() {
    let seed = one_seed().unwrap_or(7);
    let sc = named("default");
    let trace = |r: &Result<inventory_sim::Outcome, Failure>| match r {
        Ok(o) => o.trace.clone(),
        Err(f) => f.trace.clone(),
    };
    let a = run(seed, &sc);
    assert!(trace(&a).len() > 300, "a run is a few hundred steps");
    assert_eq!(trace(&a), trace(&run(seed, &sc)));
    // A failing seed replays to the same failure, step for step.
    let broken = named("broken-replays");
    let x = (0..200).find_map(|seed| run(seed, &broken).err()).expect("the broken center is caught");
    let y = run(x.seed, &broken).unwrap_err();
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
        let found = (0..500).find_map(|seed| run_checked(seed, &sc, check::check_state).err());
        let Some(f) = found else { panic!("scenario {name}: no visible damage in seeds 0..500") };
        assert_eq!(f.violation.invariant, "3", "{f}");
        println!("scenario {name}: visible at seed {}: {}", f.seed, f.violation);
    }
}

/// A store whose stamps do not move with every write (a script that forgot to raise the
/// write sequence) lets quiet heartbeats report stale counts: invariant R sees it.
#[test]
fn a_store_whose_stamps_miss_writes_is_caught() {
    assert_caught("broken-stamps", "R");
}

#[test]
fn an_agent_that_trusts_its_own_clock_is_caught() {
    // Agents whose clocks run up to 3 s from the center's open and close by their own.
    assert_caught("broken-clock", "S");
}
