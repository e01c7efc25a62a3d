//! Quiet heartbeats: reporting a pool without reading all of it.
//!
//! A whole read of a pool (its counters, and the intact check of each of its structures)
//! costs the store a dozen commands; a heartbeat of a hundred thousand pools made of those
//! takes seconds, a good part of the lease. Most pools of a large catalogue did not change
//! between two heartbeats, and the store says so cheaply: every call that changes a pool
//! raises its write sequence (`lua/intact.lua`, `Pool::write_seq`), including the calls of
//! the channel's other replicas and the sweeper. So a heartbeat first reads each pool's
//! **stamp** (generation and write sequence, one hash read), and a pool whose stamp is the
//! one its last whole read saw is reported from that read.
//!
//! What a stamp cannot see is a pool that lost one of its structures and nothing else (an
//! evicted reservations hash), since only a whole read checks the markers. Such a pool
//! sells nothing (every script refuses it), so reporting its last counts is what the
//! center would have heard had the loss come just after that read: the loss reaches the
//! center later, never wrong. How much later is bounded: a pool is read whole again at
//! least every [`Settings::full_read_every_ms`](super::Settings), and the driver reads a
//! share of the pools whole at every heartbeat, in turn ([`full_reads_per_heartbeat`]), so
//! the bound is reached by a few at a time rather than by every pool at once. A pool that
//! went back in time (an older copy of the store) shows an older sequence, or the `behind`
//! mark, and is read whole; it cannot climb back to the sequence seen unnoticed, since
//! the store refuses writes to a pool below its caller's floor.

//!
//! **Quiet looks** follow the same idea. The rebalancer looks at every pool, however idle,
//! every half second to a minute (`workers::idle_look_every_ms`); a whole look sweeps the
//! expired reservations and reads the pool whole, a script run that costs the store as
//! much as a whole read. A pool whose stamp is the one its last whole look saw, and which
//! held no reservation then, has nothing to expire and counters the look already has: the
//! rules decide from that look's read ([`ItemCore::look_unchanged`]) as they would from a
//! new one, since time alone (above-high timing, the schedule) enters through `now`, not
//! the read. A pool is still looked at whole at least every
//! [`Settings::whole_look_every_ms`](super::Settings), which forgets its old finished
//! records; a structure lost with the hash left shows at that look, at the next whole
//! heartbeat read, or at once to any call that writes.
//!
//! **A write's answer is a read.** A Borrow's refill is answered with the pool as the
//! write left it ([`Reply::Wrote`](super::Reply)): the store checked every structure before
//! it wrote, as a whole read does, and the answer is taken in the same atomic step. So it
//! stands for a whole read at the write ([`ItemCore::on_write_answer`]): the heartbeats and
//! the looks that follow read the pool's stamp, not the pool, as after a whole read. A
//! pool stocked by this agent is then read whole neither by the look after its refill nor
//! by the heartbeat that reports it.

use super::item::{ItemCore, Mode, ReadToken};
use super::{Ctx, Note, OpKind, PoolView, Report};
use crate::schedule::CenterNow;

/// The default of [`Settings::full_read_every_ms`](super::Settings).
pub const FULL_READ_EVERY_MS: i64 = 120_000;

/// The default of [`Settings::whole_look_every_ms`](super::Settings).
pub const WHOLE_LOOK_EVERY_MS: i64 = 300_000;

/// What a cheap read of a pool shows: its generation (0: missing, or found lost by the
/// store's own checks) and its write sequence (0 from a store that keeps none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStamp {
    pub generation: u64,
    pub write_seq: u64,
}

/// A whole read the rules reported from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FullRead {
    view: PoolView,
    write_seq: u64,
    at_ms: i64,
}

impl FullRead {
    /// Whether `stamp` shows the pool as this read saw it: the same write sequence (0 is a
    /// store that keeps none), of the generation the rules know (`generation`; 0 is a pool
    /// missing or found lost).
    fn vouched_by(&self, stamp: PoolStamp, generation: u64) -> bool {
        stamp.generation != 0
            && stamp.generation == generation
            && stamp.generation == self.view.generation
            && stamp.write_seq != 0
            && stamp.write_seq == self.write_seq
    }
}

/// How many of `items` pools a heartbeat every `period_ms` reads whole on top of those
/// whose stamp moved, so each is read whole about twice within `full_read_every_ms`, before
/// the bound forces it (rounded down: a handful of items is read whole only when the bound
/// or a write says so).
pub fn full_reads_per_heartbeat(items: usize, period_ms: i64, full_read_every_ms: i64) -> usize {
    let (Ok(bound), Ok(period)) = (u128::try_from(full_read_every_ms), u128::try_from(period_ms.max(0))) else {
        return items;
    };
    if bound == 0 {
        return items;
    }
    let per = (items as u128).saturating_mul(2).saturating_mul(period) / bound;
    usize::try_from(per).unwrap_or(usize::MAX).min(items)
}

impl ItemCore {
    /// [`ItemCore::report`] of a whole read that showed write sequence `write_seq`: what a
    /// heartbeat reports after reading the pool whole. A counts report is remembered with
    /// its sequence, for [`ItemCore::report_unchanged`].
    pub fn report_read(
        &mut self,
        read: Option<(PoolView, u64)>,
        token: ReadToken,
        ctx: Ctx,
        notes: &mut Vec<Note>,
    ) -> Option<Report> {
        let report = self.report(read.map(|(view, _)| view), token, ctx, notes);
        self.last_full_read = match (&report, read) {
            (Some(Report::Counts(view)), Some((_, write_seq))) if !self.segments_lost => {
                Some(FullRead { view: *view, write_seq, at_ms: ctx.now_ms })
            }
            // Whatever else came of it (lost, refused, a partly lost pool), the next
            // report reads the pool whole.
            _ => None,
        };
        report
    }

    /// The report of a pool whose stamp (read after `token` was taken) is the one its last
    /// whole read saw, from that read; `None` when the pool must be read whole: it was
    /// written since, its generation is not the one the rules know, the last whole read is
    /// older than [`Settings::full_read_every_ms`](super::Settings) (or in the future of
    /// the driver's clock), part of it is lost or being reopened, the store keeps no
    /// sequence, or an operation changed what the rules know since the token.
    pub fn report_unchanged(&self, stamp: PoolStamp, token: ReadToken, ctx: Ctx) -> Option<Report> {
        if self.mode == Mode::Lost || self.segments_lost || self.reopening || !self.current(token) {
            return None;
        }
        let last = self.last_full_read?;
        let age = ctx.now_ms.checked_sub(last.at_ms)?;
        let fresh = (0..self.settings.full_read_every_ms).contains(&age);
        (fresh && last.vouched_by(stamp, self.generation)).then_some(Report::Counts(last.view))
    }
}

impl ItemCore {
    /// A write of the running operation answered with the pool as it left it (`view`, at
    /// write sequence `write_seq`), remembered as a whole read for the heartbeats
    /// ([`ItemCore::report_unchanged`]) and, when the pool holds no reservation (nothing a
    /// sweep could expire), for the looks ([`ItemCore::look_unchanged`]). The looks' bound
    /// still counts from the last whole look, which is what forgets old finished records.
    /// Ignored unless the pool sells whole, of the generation the rules know.
    pub(super) fn on_write_answer(&mut self, view: PoolView, write_seq: u64, now_ms: i64) {
        let usable = self.mode == Mode::Selling
            && !self.segments_lost
            && !self.reopening
            && view.generation != 0
            && view.generation == self.generation
            && write_seq != 0;
        if !usable {
            return;
        }
        self.last_view = Some(view);
        self.last_full_read = Some(FullRead { view, write_seq, at_ms: now_ms });
        if view.reserved == 0 {
            let at_ms = self.last_whole_look.map_or(now_ms, |last| last.at_ms);
            self.last_whole_look = Some(FullRead { view, write_seq, at_ms });
        }
    }

    /// [`ItemCore::on_look_at`] of a whole look: the sweep (which put back `freed` units),
    /// then a whole read of the pool that showed write sequence `write_seq`. The read is
    /// remembered for [`ItemCore::look_unchanged`] when it is current and the pool sells.
    #[allow(clippy::too_many_arguments)]
    pub fn on_whole_look(
        &mut self,
        view: PoolView,
        write_seq: u64,
        token: ReadToken,
        freed: u64,
        ctx: Ctx,
        now: CenterNow,
        notes: &mut Vec<Note>,
    ) -> Option<OpKind> {
        // Before the look, which may adopt the read's generation (a first read of the pool).
        let current = self.current(token);
        let kind = self.on_look_at(view, token, freed, ctx, now, notes);
        let usable = current
            && self.mode == Mode::Selling
            && !self.segments_lost
            && !self.reopening
            && view.generation != 0
            && view.generation == self.generation
            && write_seq != 0;
        self.last_whole_look = usable.then_some(FullRead { view, write_seq, at_ms: ctx.now_ms });
        kind
    }

    /// Whether a look at `now_ms` may be answered from the pool's stamp: its last whole look
    /// is fresh and held no reservation. The driver reads the stamps of these pools only.
    pub fn may_look_unchanged(&self, now_ms: i64) -> bool {
        self.mode == Mode::Selling
            && self.last_whole_look.is_some_and(|last| {
                last.view.reserved == 0
                    && now_ms
                        .checked_sub(last.at_ms)
                        .is_some_and(|age| (0..self.settings.whole_look_every_ms).contains(&age))
            })
    }

    /// The read a look decides from (with [`ItemCore::on_look_at`], nothing swept) when the
    /// pool's stamp, read after `token` was taken, is the one its last whole look saw;
    /// `None` when the look must sweep and read the pool whole: it was written since, its
    /// generation is not the one the rules know, it held reservations then (one may have
    /// expired since), that look is older than [`Settings::whole_look_every_ms`](super::Settings)
    /// (or in the future of the driver's clock), the pool is not selling, part of it is lost
    /// or being reopened, the store keeps no sequence, or an operation changed what the
    /// rules know since the token.
    pub fn look_unchanged(&self, stamp: PoolStamp, token: ReadToken, ctx: Ctx) -> Option<PoolView> {
        if !self.may_look_unchanged(ctx.now_ms) || self.segments_lost || self.reopening || !self.current(token) {
            return None;
        }
        let last = self.last_whole_look?;
        last.vouched_by(stamp, self.generation).then_some(last.view)
    }
}
