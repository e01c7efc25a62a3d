//! The invariants of the brief, checked against the world after every step
//! ([`check_step`]) and at quiescence ([`check_quiescent`]). Numbers are the brief's.
//!
//! Counters are compared in `u128` and sums never wrap, so a broken counter is reported
//! as a violation, never a panic.

use std::collections::BTreeMap;

use inventory_core::ledger;

use crate::config::Violation;
use crate::world::{ReservationState, World};

type Res = Result<(), Violation>;

/// Everything that must hold at every instant.
pub fn check_step(w: &World) -> Res {
    check_bookkeeping(w)?;
    crate::schedules::check_schedules(w)?;
    crate::shares::check_caps(w)?;
    check_state(w)
}

/// Invariants 4 and 6 as the reference model counts them (how often each request id
/// changed the ledger or filled a pool, and whether a stale epoch was ever let through),
/// and R, the simulator's own: heartbeats tell the pools as they are.
pub fn check_bookkeeping(w: &World) -> Res {
    // 4: a request id changes the ledger at most once; a grant id fills a pool at most once.
    if let Some(((scope, id), n)) = w.center.applied.iter().find(|(_, n)| **n > 1) {
        return Err(Violation::new("4", format!("request {scope}/{id} was applied {n} times")));
    }
    if let Some(((c, item, id), n)) = w.reference.refills.iter().find(|(_, n)| **n > 1) {
        return Err(Violation::new("4", format!("grant {id} was added to {}/{item} {n} times", w.agents[*c].name())));
    }
    // R: a heartbeat tells each pool as it is (a pool lost with its hash left aside: its
    // stamp may still vouch for its last whole read, until the bound).
    if let Some(s) = w.reference.untrue_reports.first() {
        return Err(Violation::new("R", s.clone()));
    }
    // 6: nothing with an old epoch was applied.
    if let Some(s) = w.center.stale_applied.first() {
        return Err(Violation::new("6", format!("applied with a stale epoch: {s}")));
    }
    Ok(())
}

/// Invariants 1, 3, 5 (and 8's "never back in the pool") judged on the state alone:
/// the ledger, the pools and what buyers hold.
pub fn check_state(w: &World) -> Res {
    for (name, item) in &w.center.items {
        let allocations = w.center.allocations_of(name);
        // 1 (and the reported-oversell rule, against `total + written_off`: units written
        // off as sold may still show as sold in later reports) as Reconcile sees it.
        let check = ledger::check_item(name, &item.state, &allocations);
        // A rolled-back ledger may see reports of more reserved + sold than the total, by
        // at most what it lost (counted apart: `crate::rollback`).
        let lost = u128::from(w.lost_to_rollbacks(name));
        let reported: u128 =
            allocations.iter().map(|(_, a)| u128::from(a.reported.reserved) + u128::from(a.reported.sold)).sum();
        let reported_over = reported.saturating_sub(u128::from(item.state.total) + u128::from(item.state.written_off));
        let allowed = |f: &&ledger::Finding| f.invariant == "oversell" && reported_over <= lost;
        if let Some(f) = check.violations.iter().find(|f| !allowed(f)) {
            let invariant = if f.invariant == "oversell" { "3" } else { "1" };
            return Err(Violation::new(invariant, format!("check_item {name}: {} {}", f.channel, f.detail)));
        }
        // 1 directly: total = center available + Σ held, and held never below zero.
        let mut held: u128 = 0;
        for (channel, a) in &allocations {
            if u128::from(a.returned) + u128::from(a.reclaimed) > u128::from(a.granted) {
                return Err(Violation::new(
                    "1",
                    format!("{channel}/{name}: returned + reclaimed exceeds granted {a:?}"),
                ));
            }
            held += u128::from(a.held());
        }
        if u128::from(item.state.total) != u128::from(item.state.available) + held {
            return Err(Violation::new(
                "1",
                format!(
                    "{name}: total {} != center available {} + held {held}",
                    item.state.total, item.state.available
                ),
            ));
        }
        // 3: what buyers hold, over every pool (and what lost pools had sold), never
        // exceeds the total.
        let mut committed: u128 = 0;
        for c in 0..w.agents.len() {
            let Some(pool) = w.pool_seen(c, name) else { continue };
            committed += u128::from(pool.reserved()) + u128::from(pool.sold());
            committed += u128::from(w.lost_sold(c, name));
        }
        // Units written off as sold left the total but may still show as sold in a pool.
        let ever = u128::from(item.state.total) + u128::from(item.state.written_off);
        let unwitnessed: u128 = (0..w.agents.len()).map(|c| u128::from(w.unwitnessed(c, name))).sum();
        if committed > ever + lost + unwitnessed {
            return Err(Violation::new(
                "3",
                format!(
                    "{name}: reserved + sold over all pools is {committed}, total is {} (+{} written off, +{lost} \
                     lost by ledger rollbacks)",
                    item.state.total, item.state.written_off
                ),
            ));
        }
        // 3, the escrow rules that make it hold: units a channel's buyers reserved or bought
        // are units the center counts as the channel's; and a pool only holds units its
        // channel holds, except units just reclaimed that the agent has not yet resynced
        // (still available in the pool, the resync takes them out).
        for (c, agent) in w.agents.iter().enumerate() {
            let Some(pool) = w.pool_seen(c, name) else { continue };
            let in_pool = u128::from(pool.counts().sum());
            let written_off = u128::from(w.reference.written_off.get(&(c, name.clone())).copied().unwrap_or(0));
            // Written-off units are sold units the channel no longer holds; units a rolled-back
            // ledger forgot it holds and has not re-learned yet are the channel's too.
            let held = u128::from(w.center.held(name, agent.name()))
                + written_off
                + u128::from(w.rollback_allowance(c, name))
                + u128::from(w.unwitnessed(c, name));
            // Units sold from pool data that was later lost are still the channel's: they
            // are in doubt (invariant 8), never back at the center or in the pool.
            let lost_sold = u128::from(w.lost_sold(c, name));
            let bought = u128::from(pool.reserved()) + u128::from(pool.sold()) + lost_sold;
            if bought > held {
                return Err(Violation::new(
                    if bought - lost_sold > held { "3" } else { "8" },
                    format!(
                        "{}/{name}: buyers hold {bought} units of the channel ({} reserved, {} sold{}) but the \
                         center counts only {held} as the channel's: {} units are also at the center, which can \
                         sell them again",
                        agent.name(),
                        pool.reserved(),
                        pool.sold(),
                        if lost_sold > 0 {
                            format!(", {lost_sold} sold from pool data since lost")
                        } else {
                            String::new()
                        },
                        bought - held
                    ),
                ));
            }
            let reclaimed = u128::from(w.reference.reclaimed(c, name));
            if in_pool + lost_sold > held + reclaimed {
                return Err(Violation::new(
                    if lost_sold > 0 { "8" } else { "3" },
                    format!(
                        "{}/{name}: the pool holds {in_pool} units ({}/{}/{} available/reserved/sold){} but the \
                         center counts only {held} as the channel's (+{reclaimed} reclaimed, not yet resynced): \
                         {} units exist twice",
                        agent.name(),
                        pool.available(),
                        pool.reserved(),
                        pool.sold(),
                        if lost_sold > 0 {
                            format!(" and sold {lost_sold} before its data was lost")
                        } else {
                            String::new()
                        },
                        in_pool + lost_sold - held - reclaimed
                    ),
                ));
            }
        }
        check_pools(w, name, item.state.per_user_limit)?;
        if w.config.doubt_requires_data_loss {
            for (c, agent) in w.agents.iter().enumerate() {
                let a = w.center.allocations.get(&(name.clone(), agent.name().to_owned())).copied().unwrap_or_default();
                let key = (c, name.clone());
                // A rolled-back ledger may hold an older generation of the pool: the next
                // report looks like a lost pool.
                let explained = w.reference.pool_losses.contains_key(&key)
                    || w.reference.reclaimed_into_doubt.contains_key(&key)
                    || w.lost_to_rollbacks(name) > 0;
                if a.in_doubt > 0 && !explained {
                    return Err(Violation::new(
                        "7",
                        format!(
                            "{}/{name}: {} units in doubt though no pool store lost data and no reclaim put them \
                             in doubt; they are stranded until \
                             an operator resolves them",
                            agent.name(),
                            a.in_doubt
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Pool counters agree with the reservations, and no user holds more than the limit (5).
fn check_pools(w: &World, item: &str, limit: u64) -> Res {
    for (c, agent) in w.agents.iter().enumerate() {
        let Some(pool) = w.pool_seen(c, item) else { continue };
        let (mut reserved, mut sold) = (0u128, 0u128);
        let mut per_user: BTreeMap<&str, u128> = BTreeMap::new();
        for (_, r) in pool.reservations() {
            match r.state {
                ReservationState::Reserved => reserved += u128::from(r.quantity),
                ReservationState::Confirmed => sold += u128::from(r.quantity),
                ReservationState::Cancelled | ReservationState::Expired | ReservationState::Refunded => continue,
            }
            *per_user.entry(&r.user_id).or_default() += u128::from(r.quantity);
        }
        if (reserved, sold) != (u128::from(pool.reserved()), u128::from(pool.sold())) {
            return Err(Violation::new(
                "3",
                format!(
                    "{}/{item}: counters say {} reserved {} sold, reservations say {reserved} and {sold}",
                    agent.name(),
                    pool.reserved(),
                    pool.sold()
                ),
            ));
        }
        // Invariant 9, cheaply: the kept events run without a gap up to the last written.
        let page = pool.events(0, 1);
        let kept = pool.outbox_stats().kept;
        if kept > 0 && page.first_kept.saturating_add(kept - 1) != page.last_sequence {
            return Err(Violation::new(
                "9",
                format!(
                    "{}/{item}: {kept} events kept from sequence {} but the last written is {}",
                    agent.name(),
                    page.first_kept,
                    page.last_sequence
                ),
            ));
        }
        for (user, held) in per_user {
            if held > u128::from(limit) {
                return Err(Violation::new(
                    "5",
                    format!("{user} holds {held} of {item} in {} (limit {limit})", agent.name()),
                ));
            }
            if held != u128::from(pool.held_by(user)) {
                return Err(Violation::new(
                    "5",
                    format!("{}/{item}: the pool's count for {user} is not {held}", agent.name()),
                ));
            }
        }
    }
    Ok(())
}

/// At quiescence (nothing in flight, every agent resynced, doubts resolved): each
/// channel's pool is exactly what the center says it holds (2), counting units written
/// off as sold on the center's side and units sold from lost pool data on the pool's.
pub fn check_quiescent(w: &World) -> Res {
    for name in w.center.items.keys() {
        for (c, agent) in w.agents.iter().enumerate() {
            let key = (c, name.clone());
            let lost = w.lost_sold(c, name);
            let in_pool = w.pool_seen(c, name).map_or(0, |p| p.counts().sum()) + lost;
            let held = w.center.held(name, agent.name()) + w.reference.written_off.get(&key).copied().unwrap_or(0);
            // Units a rolled-back ledger lent again before it saw the loss cannot be
            // re-learned (the relearn came up short): the pool keeps them beyond the ledger
            // and the item is no longer lent (counted apart).
            // So do sold units a pool rollback forgot with no witness left (counted apart).
            let beyond_ledger =
                in_pool > held && in_pool - held <= w.rollback_allowance(c, name) + w.unwitnessed(c, name);
            // And units it lost the Returns of stay with the channel and on no shelf.
            let stranded = held > in_pool && held - in_pool <= w.stranded_by_rollback(c, name);
            if in_pool != held && !beyond_ledger && !stranded {
                return Err(Violation::new(
                    "2",
                    format!(
                        "{}/{name} at quiescence: center says held {held} (with units written off as sold), the \
                         pool holds {in_pool} (with units sold from lost data)",
                        agent.name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Units sold over every pool, per item, with those sold from pool data later lost.
pub fn sold(w: &World, item: &str) -> u64 {
    let in_pools: u64 = w.agents.iter().filter_map(|a| a.pools.get(item)).map(|p| p.sold()).sum();
    let lost: u64 = w.reference.lost_sold.iter().filter(|((_, i), _)| i == item).map(|(_, n)| n).sum();
    in_pools + lost
}

/// Where the units of an item are, for a stranded-stock report.
pub fn whereabouts(w: &World, item: &str) -> String {
    let state = &w.center.item(item).state;
    let mut parts = vec![format!("{item}: total {}, center available {}", state.total, state.available)];
    for agent in &w.agents {
        let pool = agent.pools.get(item).cloned().unwrap_or_default();
        let core = agent.mem.as_ref().and_then(|m| m.items.get(item)).map(|s| &s.core);
        parts.push(format!(
            "{}: held {}, pool {}/{}/{} available/reserved/sold{}",
            agent.name(),
            w.center.held(item, agent.name()),
            pool.available(),
            pool.reserved(),
            pool.sold(),
            core.map_or_else(
                || " (down)".to_owned(),
                |c| format!(" ({:?}, {:?}, {:?}, busy {})", c.mode(), c.supply(), c.shelf(), c.busy())
            )
        ));
    }
    parts.join("; ")
}
