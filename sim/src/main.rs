//! `inventory-sim [--scenario NAME] [--seed START] [--seeds N] [--steps N] [--trace] [--state-only] [--keep-going]`
//!
//! Runs N seeds from START (default 0 and 1000) of a scenario (default `default`) and
//! prints the first failing seed with its trace, or a summary. With `--trace`, runs the
//! one seed START and prints its whole trace. With `--state-only`, judges only the visible
//! state (`check::check_state`), not the reference model's bookkeeping. With
//! `--keep-going`, runs every seed, prints a line per failing one, the failing seeds by
//! invariant and the totals of the others.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use inventory_sim::{Checker, Stats, check, run_checked, scenario, scenarios};

fn usage() -> String {
    let names: Vec<&str> = scenarios().iter().map(|s| s.name).collect();
    format!(
        "usage: inventory-sim [--scenario NAME] [--seed START] [--seeds N] [--steps N] [--trace] [--state-only] [--keep-going]\nscenarios: {}",
        names.join(", ")
    )
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut name, mut start, mut count, mut steps, mut trace) = ("default".to_owned(), 0u64, 1000u64, None, false);
    let mut keep_going = false;
    let mut checker: Checker = check::check_step;
    while let Some(arg) = args.next() {
        let mut value = |flag: &str| args.next().ok_or_else(|| format!("{flag} needs a value"));
        let parsed: Result<(), String> = match arg.as_str() {
            "--scenario" => value("--scenario").map(|v| name = v),
            "--seed" => value("--seed").and_then(|v| v.parse().map(|n| start = n).map_err(|e| format!("--seed: {e}"))),
            "--seeds" => {
                value("--seeds").and_then(|v| v.parse().map(|n| count = n).map_err(|e| format!("--seeds: {e}")))
            }
            "--steps" => {
                value("--steps").and_then(|v| v.parse().map(|n| steps = Some(n)).map_err(|e| format!("--steps: {e}")))
            }
            "--trace" => {
                trace = true;
                Ok(())
            }
            "--keep-going" => {
                keep_going = true;
                Ok(())
            }
            "--state-only" => {
                checker = check::check_state;
                Ok(())
            }
            "-h" | "--help" => {
                println!("{}", usage());
                return ExitCode::SUCCESS;
            }
            other => Err(format!("unknown argument {other:?}")),
        };
        if let Err(e) = parsed {
            eprintln!("{e}\n{}", usage());
            return ExitCode::from(2);
        }
    }
    let Some(mut sc) = scenario(&name) else {
        eprintln!("unknown scenario {name:?}\n{}", usage());
        return ExitCode::from(2);
    };
    if let Some(steps) = steps {
        sc.config.steps = steps;
    }
    if trace {
        return match run_checked(start, &sc, checker) {
            Ok(outcome) => {
                for line in &outcome.trace {
                    println!("{line}");
                }
                println!("seed {start}: every invariant kept; {:?}", outcome.stats);
                ExitCode::SUCCESS
            }
            Err(failure) => {
                for line in &failure.trace {
                    println!("{line}");
                }
                println!("{failure}");
                ExitCode::FAILURE
            }
        };
    }
    let began = Instant::now();
    let mut total = Stats::default();
    let mut broken: BTreeMap<&'static str, Vec<u64>> = BTreeMap::new();
    for seed in start..start.saturating_add(count) {
        match run_checked(seed, &sc, checker) {
            Ok(outcome) => total.add(&outcome.stats),
            Err(failure) if keep_going => {
                let detail: String = failure.violation.detail.chars().take(160).collect();
                println!(
                    "seed {seed} broke invariant {} at step {}: {detail}",
                    failure.violation.invariant, failure.step
                );
                broken.entry(failure.violation.invariant).or_default().push(seed);
            }
            Err(failure) => {
                println!("{failure}");
                println!("first failing seed: {seed} ({} seeds passed before it)", seed - start);
                return ExitCode::FAILURE;
            }
        }
    }
    if !broken.is_empty() {
        let n: usize = broken.values().map(Vec::len).sum();
        println!(
            "scenario {name}: {n} of seeds {start}..{} broke an invariant in {:.1?}: {broken:?}\ntotals of the others: {total:?}",
            start.saturating_add(count),
            began.elapsed()
        );
        return ExitCode::FAILURE;
    }
    println!(
        "scenario {name}: seeds {start}..{} kept every invariant in {:.1?}\ntotals: {total:?}",
        start.saturating_add(count),
        began.elapsed()
    );
    ExitCode::SUCCESS
}
