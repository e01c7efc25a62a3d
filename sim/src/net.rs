//! The network and the center link (`agent/src/link/`): every attempt of a Borrow or
//! Return carries the same request id and the epoch its operation read before its pool
//! writes; an attempt or its reply may be lost, delayed (within the deadline) or
//! reordered; an attempt that times out is retried, up to [`LINK_ATTEMPTS`], and then the
//! call's outcome is unknown (its attempts may still land). Answers become the rules'
//! replies as `stocking.rs` maps gRPC codes: FAILED_PRECONDITION is a refusal, anything
//! else an unknown outcome.

use inventory_core::channel::{CallFault, Reply};

use crate::agent::Res;
use crate::center::{Answer, Refusal};
use crate::config::{LINK_ATTEMPTS, Violation};
use crate::world::{Message, World};

impl World {
    /// The link sends the current attempt of the item's call.
    pub(crate) fn send(&mut self, c: usize, item: &str) -> Res {
        let mem = self.mem(c);
        let (epoch_now, incarnation) = (mem.epoch, mem.incarnation);
        let call = mem.items[item].call.clone().expect("a call");
        if call.attempt == 1 && call.epoch != epoch_now {
            self.stats.calls_sent_under_their_pool_epoch += 1;
        }
        let what = format!(
            "{} sends {} {item} x{} {} attempt {} epoch {}",
            self.name(c),
            if call.borrow { "borrow" } else { "return" },
            call.quantity,
            call.request_id,
            call.attempt,
            call.epoch
        );
        if !self.calm() && self.rng.percent(self.config.faults.lose_request_pct) {
            self.log(format!("{what}: lost"));
            self.stats.lost_messages += 1;
            return Ok(());
        }
        self.log(what);
        self.network.push(Message::Request {
            sent_at_ms: self.now_ms,
            channel: c,
            incarnation,
            epoch: call.epoch,
            borrow: call.borrow,
            item: item.to_owned(),
            quantity: call.quantity,
            request_id: call.request_id,
            attempt: call.attempt,
            sell_rate_milli: call.sell_rate_milli,
            write_seq: call.write_seq,
        });
        Ok(())
    }

    /// The current attempt of the item's call timed out: retry, or give up (outcome
    /// unknown).
    pub(crate) fn time_out(&mut self, c: usize, item: &str) -> Res {
        let name = self.name(c);
        let mem = self.mem(c);
        mem.unanswered += 1;
        let call = mem.items.get_mut(item).and_then(|s| s.call.as_mut()).expect("a call");
        if call.attempt < LINK_ATTEMPTS {
            call.attempt += 1;
            let line = format!("{name} {} attempt {} timed out; retrying", call.request_id, call.attempt - 1);
            self.stats.retries += 1;
            self.log(line);
            return self.send(c, item);
        }
        let call = self.slot(c, item).call.take().expect("a call");
        self.stats.give_ups += 1;
        if !self.config.faults.late_attempts {
            let before = self.network.len();
            self.network.retain(
                |m| !matches!(m, Message::Request { channel, request_id, .. } if *channel == c && *request_id == call.request_id),
            );
            self.stats.lost_messages += u64::try_from(before - self.network.len()).unwrap_or(0);
        }
        self.log(format!("{} {} gave up after {} attempts", self.name(c), call.request_id, call.attempt));
        self.feed(c, item, call.op, Reply::Center(CallFault::Unknown))?;
        self.settle(c)
    }

    /// Whether the center's database answers now.
    pub fn center_down(&self) -> bool {
        self.center_down_until.is_some()
    }

    /// The center's database stops answering for `ms`.
    pub(crate) fn start_outage(&mut self, ms: i64) {
        self.center_down_until = Some(self.now_ms + ms);
        self.stats.outages += 1;
        self.log(format!("center: database down for {ms} ms"));
    }

    /// The database answers again: the calls that waited for it are applied, in whatever
    /// order they now reach it, and their replies go back (to callers that may have given
    /// up long ago).
    pub(crate) fn end_outage(&mut self) {
        self.center_down_until = None;
        let parked = std::mem::take(&mut self.parked);
        self.log(format!("center: database back; {} calls waited for it", parked.len()));
        for mut m in parked {
            if let Message::Request { sent_at_ms, .. } = &mut m {
                *sent_at_ms = self.now_ms;
            }
            self.stats.applied_after_outage += 1;
            self.network.push(m);
        }
    }

    /// Delivers message `i` (any order: calls are independent streams).
    pub fn deliver(&mut self, i: usize) -> Res {
        if self.center_down() && matches!(self.network[i], Message::Request { .. }) {
            // Its transaction waits for the database.
            let m = self.network.remove(i);
            if let Message::Request { request_id, attempt, .. } = &m {
                self.log(format!("center: {request_id} attempt {attempt} waits for the database"));
            }
            self.parked.push(m);
            return Ok(());
        }
        match self.network.remove(i) {
            Message::Request {
                channel: c,
                incarnation,
                epoch,
                borrow,
                item,
                quantity,
                request_id,
                attempt,
                sell_rate_milli,
                write_seq,
                ..
            } => {
                let ch = self.agents[c].channel.clone();
                let breakage = self.config.breakage;
                if borrow && self.lending_stopped(&item) {
                    // UNAVAILABLE: the link retries, with the same request id.
                    self.stats.borrows_refused_beyond_ledger += 1;
                    self.log(format!("center: borrow {ch}/{item} {request_id}: not lending (pools beyond the ledger)"));
                    return Ok(());
                }
                let result = if borrow {
                    let (rate, shared) = ((sell_rate_milli, self.now_ms), self.center.shared_borrows);
                    let plan = self.center.borrow_plan(&item, ch.as_str(), self.sched.plan(&item), self.now_ms);
                    let result = self.center.borrow(&item, &ch, epoch, quantity, &request_id, rate, plan, &breakage);
                    self.stats.shared_borrows += self.center.shared_borrows - shared;
                    self.stats.planned_borrows += u64::from(quantity > plan.now().room || plan.now().kept > 0);
                    result
                } else {
                    // Before the Return applies, whatever it answers: the pool got at least
                    // this far (the Center service's `raise_write_seqs`).
                    self.center.raise_write_seq(&item, ch.as_str(), write_seq);
                    self.center.give_back(&item, &ch, epoch, quantity, &request_id, &breakage)
                };
                match &result {
                    Ok((_, true)) => self.stats.replays_answered += 1,
                    Err(Refusal::Precondition(m)) if m.contains("stale epoch") => {
                        self.stats.stale_refused += 1;
                        let own = self.agents[c].mem.as_ref().is_some_and(|m| m.incarnation == incarnation);
                        self.stats.stale_refused_own += u64::from(own);
                    }
                    _ => {}
                }
                let lost = !self.calm() && self.rng.percent(self.config.faults.lose_reply_pct);
                self.stats.lost_messages += u64::from(lost);
                let shown = match &result {
                    Ok((a, replayed)) => format!("{a:?}{}", if *replayed { " (replayed)" } else { "" }),
                    Err(r) => r.to_string(),
                };
                self.log(format!(
                    "center: {} {ch}/{item} x{quantity} {request_id} epoch {epoch} -> {shown}{}",
                    if borrow { "borrow" } else { "return" },
                    if lost { "; reply lost" } else { "" }
                ));
                self.fan_out();
                if !lost {
                    self.network.push(Message::Reply {
                        sent_at_ms: self.now_ms,
                        channel: c,
                        incarnation,
                        item,
                        request_id,
                        attempt,
                        result: result.map(|(a, _)| a),
                    });
                }
                Ok(())
            }
            Message::Reply { channel: c, incarnation, item, request_id, attempt, result, .. } => {
                let current = self.agents[c].mem.as_ref().filter(|m| m.incarnation == incarnation).and_then(|m| {
                    m.items[&item].call.as_ref().filter(|k| k.request_id == request_id && k.attempt == attempt)
                });
                let Some(call) = current.cloned() else {
                    self.log(format!("reply {request_id} attempt {attempt} to {} dropped", self.name(c)));
                    return Ok(());
                };
                self.slot(c, &item).call = None;
                self.mem(c).unanswered = 0;
                let reply = match (call.borrow, result) {
                    (true, Ok(Answer::Borrow { granted, center_available })) => {
                        if granted > 0 {
                            self.slot(c, &item).granted = Some(call.op);
                        }
                        Reply::Granted { granted, center_available }
                    }
                    (false, Ok(Answer::Return { .. })) => Reply::Done,
                    (_, Err(Refusal::Precondition(_))) => Reply::Center(CallFault::Refused),
                    (_, Err(Refusal::Conflict(_))) => Reply::Center(CallFault::Unknown),
                    (_, Ok(a)) => {
                        return Err(Violation::new("4", format!("{request_id} answered with {a:?}")));
                    }
                };
                self.log(format!("{} hears {request_id} attempt {attempt}: {reply:?}", self.name(c)));
                self.feed(c, &item, call.op, reply)?;
                self.settle(c)
            }
        }
    }

    /// Hands what the center published to the running agents it concerns.
    pub(crate) fn fan_out(&mut self) {
        for event in std::mem::take(&mut self.center.outbox) {
            for agent in &mut self.agents {
                if let Some(mem) = agent.mem.as_mut()
                    && event.concerns(agent.channel.as_str())
                {
                    mem.events.push_back(event.clone());
                }
            }
        }
    }
}
