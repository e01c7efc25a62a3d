//! The simulator's tests: many seeds keep every invariant, a seed replays exactly, and
//! deliberately broken centers are caught (the checker is not vacuous).
//!
//! `INVENTORY_SIM_SEEDS=<n>` sets how many seeds the seed sweeps run (default 200);
//! `INVENTORY_SIM_SEED=<n>` runs that one seed only and prints its trace
//! (`cargo test -p inventory-sim <test> -- --nocapture`).
//!
//! The `#[ignore]`d tests are scenarios in which the real logic breaks an invariant today
//! (see each reason); run them with `cargo test -p inventory-sim -- --ignored`. They pass
//! once the rule is fixed in `core/` or `agent/`.

use std::time::Instant;

use inventory_sim::{Failure, Scenario, Stats, check, run, run_checked, scenario};

fn seeds() -> std::ops::Range<u64> {
    if let Some(seed) = env_u64("INVENTORY_SIM_SEED") {
        return seed..seed + 1;
    }
    0..env_u64("INVENTORY_SIM_SEEDS").unwrap_or(200)
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(value.trim().parse().unwrap_or_else(|e| panic!("{name}={value:?}: {e}")))
}

fn named(name: &str) -> Scenario {
    scenario(name).unwrap_or_else(|| panic!("no scenario {name}"))
}

/// Runs the seeds of a scenario; the first failure, if any, and the summed stats.
fn sweep(sc: &Scenario) -> (Option<Failure>, Stats, usize) {
    let one = std::env::var("INVENTORY_SIM_SEED").is_ok();
    let mut total = Stats::default();
    let mut passed = 0;
    for seed in seeds() {
        match run(seed, sc) {
            Ok(outcome) => {
                if one {
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
fn assert_every_seed_passes(name: &str) -> Stats {
    let began = Instant::now();
    let (failure, stats, passed) = sweep(&named(name));
    if let Some(f) = failure {
        panic!("\n{f}\n");
    }
    println!("scenario {name}: {passed} seeds kept every invariant in {:.1?}; {stats:?}", began.elapsed());
    stats
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
    if std::env::var("INVENTORY_SIM_SEED").is_err() {
        // The faults really happened: the run is not a quiet one that proves nothing.
        assert!(stats.crashes > 0, "{stats:?}");
        assert!(stats.lost_messages > 0, "{stats:?}");
        assert!(stats.retries > 0 && stats.give_ups > 0, "{stats:?}");
        assert!(stats.replays_answered > 0, "{stats:?}");
        assert!(stats.stale_refused > 0, "stale calls of dead incarnations reached the center: {stats:?}");
        assert!(stats.resync_moves > 0, "{stats:?}");
        assert!(stats.reclaims > 0, "reclaims of stopped agents happened: {stats:?}");
        assert!(stats.sold > 0, "{stats:?}");
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
        let found = (0..200).find_map(|seed| run_checked(seed, &sc, check::check_state).err());
        let Some(f) = found else { panic!("scenario {name}: no visible damage in seeds 0..200") };
        assert_eq!(f.violation.invariant, "3", "{f}");
        println!("scenario {name}: visible at seed {}: {}", f.seed, f.violation);
    }
}

#[test]
#[ignore = "known bug (invariant 3): reclaim takes held - last reported reserved/sold, but the agent may have \
            reserved or sold more after its last successful report (before a crash, or while its lease was \
            still valid); those units end up both with buyers and back at the center (first seen at seed 9)"]
fn reclaim_of_a_crashed_agent() {
    assert_every_seed_passes("reclaim");
}

#[test]
#[ignore = "known bug (invariant 3): with its heartbeats lost, an agent keeps selling until its own lease \
            runs out (report time + ttl - margin); sales after its last successful report are unknown to the \
            center, whose reclaim takes them back (first seen at seed 0)"]
fn reclaim_of_a_partitioned_agent() {
    assert_every_seed_passes("partition");
}

#[test]
#[ignore = "known bug (invariant 3): a resync aligns the pool with held while a Borrow granted at the center \
            is not yet in the pool, or a Return taken from the pool is not yet applied; the call then lands \
            too (the link sends it with the new epoch), so the units count twice (first seen at seed 4: a \
            second process's resync; seed 19: the agent's own re-registration after being fenced)"]
fn fenced_agent_with_calls_in_flight() {
    assert_every_seed_passes("fence");
}

#[test]
#[ignore = "known bug (invariant 8): a pool lost before the agent recorded its generation, then recreated by \
            a refill, is never detected (the agent adopts the new generation, the center adopts what the \
            heartbeat reports); a later resync refills the lost units, sold ones included (first seen at \
            seed 199)"]
fn pool_data_loss() {
    assert_every_seed_passes("data-loss");
}

#[test]
#[ignore = "known bug (invariant 7): a resync treats a pool that was never created (generation 0) with \
            held > 0 as lost, e.g. after a crash or stop between the center granting the first Borrow and \
            the refill; the units are put in doubt and stay stranded until an operator resolves them, though \
            nothing was lost (first seen at seed 0)"]
fn units_in_doubt_only_after_data_loss() {
    assert_every_seed_passes("false-doubt");
}

#[test]
#[ignore = "known gap (invariants 2 and 7): a Borrow whose replies all came too late, or a Return whose \
            outcome is unknown, leaves drift that only a new registration settles; a healthy agent never \
            registers again, so those units are never sold (first seen at seed 0)"]
fn drift_without_a_resync() {
    assert_every_seed_passes("no-resync");
}
