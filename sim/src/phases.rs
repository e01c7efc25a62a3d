//! The phases of a run: random steps, then quiescence (everything in flight lands, every
//! agent registers again, buyers pay, an operator resolves units in doubt), then a sale to
//! the last unit.

use crate::check;
use crate::config::{FULL_READ_EVERY_MS, HEARTBEAT_EVERY_MS, Violation};
use crate::world::{ReservationState, World};

/// What runs after every step: [`check::check_step`] in real runs.
pub type Checker = fn(&World) -> Result<(), Violation>;

pub(crate) fn play(w: &mut World, ck: Checker) -> Result<(), Violation> {
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
        sell_out(w, ck)?;
    } else {
        // Running agents kept their drift: can the stock still be sold (7)? Then 2.
        sell_out(w, ck)?;
        check::check_quiescent(w)?;
    }
    w.end_of_run_rollback_stats();
    Ok(())
}

/// Quiescence: everything in flight lands; agents that are down restart and running
/// agents register again and resync (unless the scenario says not to); buyers pay for
/// what they reserved; an operator resolves units in doubt.
pub(crate) fn quiesce(w: &mut World, ck: Checker) -> Result<(), Violation> {
    w.log("--- drain: no more faults ---".to_owned());
    if w.center_down() {
        w.end_outage();
    }
    for agent in &mut w.agents {
        agent.store_full_until = None;
    }
    w.drain(&mut |w| ck(w))?;
    crate::rollback::let_the_center_sample(w, ck)?;
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
    w.advance(HEARTBEAT_EVERY_MS)?;
    ck(w)?;
    w.drain(&mut |w| ck(w))?;
    w.log("--- buyers pay for what they reserved ---".to_owned());
    for (c, item, id) in w.reservations.clone() {
        w.step += 1;
        w.finish(c, &item, &id, true)?;
        ck(w)?;
    }
    // Heartbeats for as long as a quiet heartbeat may vouch for a pool's last whole read:
    // a pool lost with its hash left is then reported lost (its units put in doubt).
    for _ in 0..=(FULL_READ_EVERY_MS / HEARTBEAT_EVERY_MS) {
        w.step += 1;
        w.advance(HEARTBEAT_EVERY_MS)?;
        ck(w)?;
    }
    w.drain(&mut |w| ck(w))?;
    // The operator resolves once the agents have told what they know: a resync scheduled
    // after an unknown outcome may still find units of a lost pool to put in doubt.
    scheduled_resyncs(w, ck)?;
    w.log("--- the operator resolves units in doubt ---".to_owned());
    w.resolve_in_doubt()?;
    ck(w)?;
    w.drain(&mut |w| ck(w))
}

/// A registration's resync only removes units from a pool while an outcome of the item is
/// unknown: what is missing is added by the resync scheduled after that outcome. Time
/// moves on (heartbeats go out) until every scheduled resync is due, and the rebalancer
/// runs each; then one more heartbeat each reports what they found (a lost pool puts its
/// units in doubt before the operator resolves them).
fn scheduled_resyncs(w: &mut World, ck: Checker) -> Result<(), Violation> {
    if w.scheduled_resyncs().is_empty() {
        return Ok(());
    }
    w.log("--- scheduled resyncs run when due ---".to_owned());
    for _ in 0..100 {
        let scheduled = w.scheduled_resyncs();
        if scheduled.is_empty() {
            w.step += 1;
            w.advance(HEARTBEAT_EVERY_MS)?;
            ck(w)?;
            return w.drain(&mut |w| ck(w));
        }
        let now = w.now_ms;
        let due: Vec<(usize, String)> =
            scheduled.into_iter().filter(|(_, _, at)| *at <= now).map(|(c, item, _)| (c, item)).collect();
        if due.is_empty() {
            w.step += 1;
            w.advance(HEARTBEAT_EVERY_MS)?;
            ck(w)?;
            continue;
        }
        for (c, item) in due {
            w.step += 1;
            w.rebalance(c, &item)?;
            ck(w)?;
        }
        w.drain(&mut |w| ck(w))?;
    }
    Err(Violation::new("2", format!("scheduled resyncs never ran: {:?}", w.scheduled_resyncs())))
}

/// Rounds of demand in a row that may sell nothing before stock counts as stranded. The
/// last units can bounce between starving channels for a while: each short Borrow makes
/// the center ask the others to give back, and the give-back queued behind the winner's
/// Borrow returns the unit unless the waiting Acquire's retry gets it first, so a stall
/// is only a stall after many rounds.
pub const IDLE_ROUNDS: usize = 100;

/// The end of the sale: buyers pay for what they reserved, then demand exceeds supply on
/// every channel until every unit is sold (invariant 7). Rounds in which nothing sells
/// are counted; [`IDLE_ROUNDS`] in a row means stock is stranded.
pub(crate) fn sell_out(w: &mut World, ck: Checker) -> Result<(), Violation> {
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
        // Units ever sold: the total, plus what was written off after it was sold. Items
        // closed by their schedule sell nothing more: what they did not sell is left out.
        // Items a rolled-back ledger no longer lends (units lent twice) sell nothing more
        // from the center either.
        let open: Vec<&String> = items.iter().filter(|i| !w.closed_by_schedule(i) && !w.lending_stopped(i)).collect();
        // Units a rolled-back ledger left with channels that gave them back are on no shelf.
        let total: u64 = open
            .iter()
            .map(|i| {
                let state = &w.center.item(i).state;
                (state.total + state.written_off).saturating_sub(w.stranded_by_rollbacks(i))
            })
            .sum();
        let sold_open: u64 = open.iter().map(|i| check::sold(w, i)).sum();
        if sold_open >= total {
            w.stats.closed_units_on_shelves = items
                .iter()
                .filter(|i| w.closed_by_schedule(i))
                .flat_map(|i| w.agents.iter().filter_map(|a| a.pools.get(i.as_str())))
                .map(|p| p.available())
                .sum();
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
