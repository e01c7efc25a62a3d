//! One item's state in a channel and the selling-side transitions: admission of an
//! Acquire, the sold-out fast path, misses, the rebalancer's look, reports, events.
//! The stocking operations are in [`super::ops`].

use std::collections::{BTreeSet, VecDeque};

use super::ops::{Op, OpKind, Queued, Unsettled};
use super::{Ctx, Note, Policy, PoolView, Report, Settings};
use crate::rate::{SellRate, rate_report_changed};
use crate::rebalance::{self, Action, Inputs};
use crate::schedule::{CenterNow, Phase, Schedule};
use crate::watermarks::Watermarks;

mod schedule;

/// Whether the item may be sold from its pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Selling from the pool.
    Selling,
    /// The pool store lost the pool (its generation changed or it vanished): the units the
    /// channel held are in doubt. Nothing is sold or given back; heartbeats report the pool
    /// lost, so the center puts its units in doubt. Ends when a resync finds the channel
    /// held nothing, or an operator resolves the doubt.
    Lost,
    /// The pool is intact but the center holds some of the channel's units of the item in
    /// doubt (a reclaim without the agent's last word). Nothing is sold or given back; the
    /// pool is reported as it is. Ends when an operator resolves the doubt.
    InDoubt,
}

/// What the agent believes of the center's supply of the item.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Supply {
    /// The center said it has none left (a Borrow or DescribeItem answered 0).
    pub center_dry: bool,
    /// The center asked holders to give back idle units: borrow only on real misses.
    pub end_of_sale: bool,
    /// The center holds no more than a scheduled item's reserve: the reserve is for the
    /// channel that runs dry, so borrow only on real misses (see `item/schedule.rs`).
    pub at_reserve: bool,
}

impl Supply {
    /// Whether the pool may borrow ahead of demand (watermark refills).
    pub fn may_prefetch(&self) -> bool {
        !self.center_dry && !self.end_of_sale && !self.at_reserve
    }
}

/// The pool as the selling side last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shelf {
    /// May have stock: Acquires go to the store.
    Stocked,
    /// The store answered sold out with nothing available.
    Empty,
    /// Empty while the center is dry: every Acquire is answered SOLD_OUT from memory,
    /// except replays of these keys (they reserved, and get their reservation back).
    EmptyFast(BTreeSet<String>),
}

/// Taken before a pool read that happens outside the item's operations (the rebalancer's
/// look, a heartbeat's report), handed back with what the read saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadToken(u64, u64);

/// What to do with an Acquire before any store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Refuse(Refusal),
    /// SOLD_OUT from memory (the item is closed, or sold out everywhere).
    SoldOut,
    /// Go to the store; `shelf` is what [`ItemCore::on_sold_out`] needs if it says sold out.
    Store {
        shelf: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The pool was lost: UNAVAILABLE until reconciled.
    Lost,
    /// The center holds units in doubt: UNAVAILABLE until an operator resolves them.
    InDoubt,
    /// More than one user may ever hold: INVALID_ARGUMENT.
    OverLimit { limit: u64 },
}

/// An Acquire at an instant of the center's clock ([`ItemCore::gate`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Before the opening: NOT_STARTED from memory, nothing else is looked at.
    NotStarted { opens_at_ms: i64 },
    /// Open (or closed by its schedule: then SOLD_OUT as for a closed item).
    Admit(Admission),
}

/// What the leader does when the store answered sold out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissPlan {
    /// Nothing to do but answer SOLD_OUT.
    Answer,
    /// The center looks dry: answer SOLD_OUT, and send a small Borrow in the background
    /// (it picks up units given back elsewhere and makes the center ask holders to return).
    Signal { want: u64 },
    /// Join the item's single in-flight Borrow (or start one), wait for it, try once more.
    Borrow { want: u64 },
}

/// One item's state in a channel.
#[derive(Debug, Clone)]
pub struct ItemCore {
    pub(super) policy: Policy,
    pub(super) mode: Mode,
    pub(super) supply: Supply,
    pub(super) shelf: Shelf,
    /// Bumped whenever stock comes back into the pool: a sold-out answer read before a
    /// refill never hides the refill.
    pub(super) shelf_version: u64,
    /// The pool's generation as first seen; a change means the store lost the pool.
    pub(super) generation: u64,
    /// Bumped whenever `generation` is set: a pool read that began before (a [`ReadToken`]
    /// of an older count) may predate this agent creating the pool, and says nothing about
    /// its loss.
    pub(super) generation_changes: u64,
    /// Since when `available` has been above the high watermark.
    pub(super) above_high_since: Option<i64>,
    pub(super) last_starving_signal_ms: Option<i64>,
    /// When to resync the pool with the center (an outcome is unknown, or the pool was lost).
    pub(super) resync_at: Option<i64>,
    /// An operator resolved the doubt but the resync that follows could not finish yet.
    pub(super) resolution_pending: bool,
    /// Borrows and Returns whose outcome is unknown: an attempt may still land at the
    /// center whenever it likes (a database that comes back, a process that resumes). Each
    /// stays here until the center has answered for its request id (a replay, which applies
    /// it or repeats the first answer; once answered, no late attempt can change it); until
    /// then an empty pool is no proof of being sold out, and a resync never adds units a
    /// Return may still take away.
    pub(super) unsettled: Vec<Unsettled>,
    /// The store refused a write (it is at its memory limit): no Borrow until then.
    pub(super) store_refused_until: Option<i64>,
    /// Something happened to the pool since the rebalancer last looked at it.
    pub(super) dirty: bool,
    pub(super) last_look_ms: Option<i64>,
    /// The pool as last read (metrics render from it).
    pub(super) last_view: Option<PoolView>,
    /// The last heartbeat read of the whole pool and its write sequence ([`super::quiet`]).
    pub(super) last_full_read: Option<super::quiet::FullRead>,
    /// The last whole look, while a look may decide from it ([`ItemCore::look_unchanged`]).
    pub(super) last_whole_look: Option<super::quiet::FullRead>,
    /// The report the center last acknowledged, and the sell rate it carried.
    pub(super) last_reported: Option<Report>,
    pub(super) last_reported_rate: u64,
    /// Units reserved per second, recently.
    pub(super) rate: SellRate,
    /// The stocking queue: the running operation and those waiting for it.
    pub(super) running: Option<Op>,
    pub(super) queue: VecDeque<Queued>,
    /// Borrows that ran to the end; a queued Borrow that sees it moved skips.
    pub(super) borrows_done: u64,
    pub(super) next_op: u64,
    /// Operations finished so far: a read that began before one finished may not show it.
    pub(super) ops_finished: u64,
    /// Part of the pool (some of a segmented item's segments) was lost while the rest is
    /// intact: the intact part sells; nothing is borrowed or given back, so the center's
    /// count of the lost part's units (held minus what the intact part reports) stays
    /// exact until an operator resolves it.
    pub(super) segments_lost: bool,
    /// The lost part is being created again: reads outside the resync doing it may show
    /// the new generation before the rules adopt it, so they decide nothing until then.
    pub(super) reopening: bool,
    /// The sale's schedule, in the center's clock.
    pub(super) schedule: Schedule,
    /// The pool was stocked for the opening (or that is under way).
    pub(super) prestocked: bool,
    /// The units the center keeps back from a scheduled item's opening stock.
    pub(super) center_reserve: u64,
    pub(super) settings: Settings,
}

impl ItemCore {
    pub fn new(policy: Policy, center_available: u64, settings: Settings) -> Self {
        Self {
            policy,
            mode: Mode::Selling,
            supply: Supply { center_dry: center_available == 0, end_of_sale: false, at_reserve: false },
            shelf: Shelf::Stocked,
            shelf_version: 0,
            generation: 0,
            generation_changes: 0,
            above_high_since: None,
            last_starving_signal_ms: None,
            resync_at: None,
            resolution_pending: false,
            unsettled: Vec::new(),
            store_refused_until: None,
            dirty: true,
            last_look_ms: None,
            last_view: None,
            last_full_read: None,
            last_whole_look: None,
            last_reported: None,
            last_reported_rate: 0,
            rate: SellRate::new(settings.rate_half_life_ms),
            running: None,
            queue: VecDeque::new(),
            borrows_done: 0,
            next_op: 0,
            ops_finished: 0,
            segments_lost: false,
            reopening: false,
            schedule: Schedule::default(),
            prestocked: false,
            center_reserve: 0,
            settings,
        }
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
    }

    /// An Acquire reserved `units` (not a replay): the sell rate counts them.
    pub fn on_reserved(&mut self, units: u64, ctx: Ctx) {
        self.rate.record(units, ctx.now_ms);
    }

    /// The pool's recent sell rate, units per second × 1000.
    pub fn sell_rate_milli(&self, now_ms: i64) -> u64 {
        self.rate.milli(now_ms)
    }

    /// The watermarks in force at `now_ms`: derived from the sell rate when the item's
    /// batches follow it and the pool has sold, else the fixed ones.
    pub fn watermarks_at(&self, now_ms: i64) -> Watermarks {
        crate::watermarks::effective(self.policy.watermarks, self.policy.rate_batching, self.rate.milli(now_ms))
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub fn supply(&self) -> Supply {
        self.supply
    }

    pub fn shelf(&self) -> &Shelf {
        &self.shelf
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn last_view(&self) -> Option<PoolView> {
        self.last_view
    }

    /// When a resync is scheduled, if one is.
    pub fn resync_at(&self) -> Option<i64> {
        self.resync_at
    }

    pub fn borrows_done(&self) -> u64 {
        self.borrows_done
    }

    /// [`ItemCore::on_look`] at `now` (the center's clock's bounds): before the opening a
    /// look decides nothing (the opening's stocking fills the pool, and surplus above the
    /// high watermark only counts from the opening on); once closed it borrows nothing.
    pub fn on_look_at(
        &mut self,
        view: PoolView,
        token: ReadToken,
        freed: u64,
        ctx: Ctx,
        now: CenterNow,
        notes: &mut Vec<Note>,
    ) -> Option<OpKind> {
        let kind = self.on_look(view, token, freed, ctx, notes);
        match self.phase(now) {
            Phase::NotStarted { .. } => {
                self.above_high_since = None;
                self.expect_reserve_at_opening();
                None
            }
            Phase::Closed => kind.filter(|k| !matches!(k, OpKind::Borrow { .. })),
            Phase::Open => kind,
        }
    }

    /// The Acquire's checks before the store: mode, limit, closed, fast path.
    pub fn admit(&self, idempotency_key: &str, quantity: u64) -> Admission {
        match self.mode {
            Mode::Lost => return Admission::Refuse(Refusal::Lost),
            Mode::InDoubt => return Admission::Refuse(Refusal::InDoubt),
            Mode::Selling => {}
        }
        if quantity > self.policy.per_user_limit {
            return Admission::Refuse(Refusal::OverLimit { limit: self.policy.per_user_limit });
        }
        if self.policy.closed {
            return Admission::SoldOut;
        }
        if let Shelf::EmptyFast(keys) = &self.shelf
            && self.supply.center_dry
            && !keys.contains(idempotency_key)
        {
            return Admission::SoldOut;
        }
        Admission::Store { shelf: self.shelf_version }
    }

    /// The store answered sold out with `available` left. Marks the shelf empty unless
    /// stock came back since the Acquire was admitted (`shelf`). True when the driver
    /// should load the pool's idempotency keys for the fast path ([`ItemCore::fast_path_on`]).
    /// Followers pass `leading = false`: another replica's cancel or the leader's refill
    /// would not reach their view of the pool.
    pub fn on_sold_out(&mut self, shelf: u64, available: u64, leading: bool) -> bool {
        self.dirty = true;
        if available != 0 || !leading || shelf != self.shelf_version {
            return false;
        }
        if self.shelf == Shelf::Stocked {
            self.shelf = Shelf::Empty;
        }
        self.supply.center_dry && self.shelf == Shelf::Empty
    }

    /// Whether a Borrow or Return of the item has an outcome not settled yet: after a miss,
    /// the driver answers UNAVAILABLE (retry) rather than SOLD_OUT.
    pub fn unsettled(&self) -> bool {
        !self.unsettled.is_empty()
    }

    /// Whether the store refused a write recently (at its memory limit): nothing is
    /// borrowed meanwhile, and a miss is answered without asking the center.
    pub fn store_refusing(&self, now_ms: i64) -> bool {
        self.store_refused_until.is_some_and(|until| now_ms < until)
    }

    /// How many Borrows and Returns of the item wait for the center to answer for them.
    pub fn unsettled_calls(&self) -> usize {
        self.unsettled.len()
    }

    /// The center answered a call again: calls of unknown outcome are settled now rather
    /// than at their scheduled time (the resync replays each first, so a late attempt can
    /// no longer land after it). True when a resync became due.
    pub fn on_center_answered(&mut self, now_ms: i64) -> bool {
        if !self.unsettled.is_empty() && self.resync_at.is_some_and(|at| at > now_ms) {
            self.resync_at = Some(now_ms);
            self.dirty = true;
            return true;
        }
        false
    }

    /// The keys that reserved, loaded after [`ItemCore::on_sold_out`] asked: from now on
    /// other Acquires are answered from memory, as long as nothing changed meanwhile.
    pub fn fast_path_on(&mut self, keys: BTreeSet<String>, shelf: u64) {
        if self.supply.center_dry && self.shelf == Shelf::Empty && shelf == self.shelf_version {
            self.shelf = Shelf::EmptyFast(keys);
        }
    }

    /// The shelf version now (for a fast path load started now).
    pub fn shelf_version(&self) -> u64 {
        self.shelf_version
    }

    /// The leader's store answered sold out: what to do before answering.
    pub fn on_miss(&mut self, quantity: u64, ctx: Ctx) -> MissPlan {
        self.dirty = true;
        if self.segments_lost || self.store_refusing(ctx.now_ms) {
            // No Borrow while part of the pool is lost (see `on_segments_lost`), nor while
            // the store refuses writes (nothing borrowed could be shelved).
            return MissPlan::Answer;
        }
        if self.supply.center_dry {
            return if self.starving_signal_due(ctx.now_ms) {
                MissPlan::Signal { want: quantity }
            } else {
                MissPlan::Answer
            };
        }
        // At the end of a sale a miss asks only for what it needs, unless the pool's batch
        // follows its rate: then it asks for its batch, and the center, short, grants its
        // share by rate (a busy channel taking one unit per call would flood the center).
        let following = self.policy.rate_batching.is_some() && self.rate.milli(ctx.now_ms) > 0;
        let want = if self.supply.end_of_sale && !following {
            quantity
        } else {
            self.watermarks_at(ctx.now_ms).batch.max(quantity)
        };
        MissPlan::Borrow { want }
    }

    /// A fast SOLD_OUT (or a closed item): whether to send the starvation Borrow now.
    pub fn on_fast_sold_out(&mut self, quantity: u64, ctx: Ctx) -> Option<u64> {
        (!self.policy.closed && self.starving_signal_due(ctx.now_ms)).then_some(quantity)
    }

    /// Rate limit for the Borrow a starving pool sends while the center looks dry (and for
    /// a follower's wants): at most one per `starving_signal_every_ms`.
    pub fn starving_signal_due(&mut self, now_ms: i64) -> bool {
        let due =
            self.last_starving_signal_ms.is_none_or(|last| now_ms - last >= self.settings.starving_signal_every_ms);
        if due {
            self.last_starving_signal_ms = Some(now_ms);
        }
        due
    }

    /// Records what the center said it has left.
    pub fn set_center_available(&mut self, available: u64) {
        self.supply.center_dry = available == 0;
        self.supply.at_reserve = available <= self.reserve_kept();
        if !self.supply.center_dry && matches!(self.shelf, Shelf::EmptyFast(_)) {
            self.shelf = Shelf::Empty;
        }
    }

    /// Units came back into the pool (refill, cancel, expiry): it may sell again.
    pub fn stock_returned(&mut self) {
        self.shelf = Shelf::Stocked;
        self.shelf_version += 1;
        self.dirty = true;
    }

    /// Something happened to the pool: the rebalancer looks at it on its next tick.
    pub fn touch(&mut self) {
        self.dirty = true;
    }

    /// Whether something happened that the rebalancer should look at (taken by
    /// [`ItemCore::needs_look`]).
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Whether the rebalancer should look at the pool now: it changed, a resync is due, or
    /// `idle_every_ms` passed (reservations may have expired meanwhile).
    pub fn needs_look(&mut self, now_ms: i64, idle_every_ms: i64) -> bool {
        let due = std::mem::take(&mut self.dirty)
            || self.resync_due(now_ms)
            || self.resolution_pending
            || self.last_look_ms.is_none_or(|last| now_ms - last >= idle_every_ms);
        if due {
            self.last_look_ms = Some(now_ms);
        }
        due
    }

    pub fn resync_due(&self, now_ms: i64) -> bool {
        self.resync_at.is_some_and(|at| now_ms >= at)
    }

    /// Asks for a resync at `at_ms` (the latest request wins).
    pub(super) fn schedule_resync(&mut self, at_ms: i64) {
        self.resync_at = Some(at_ms);
    }

    /// Asks for a resync at `at_ms` at the latest (an earlier one asked stands).
    pub(super) fn resync_by(&mut self, at_ms: i64) {
        self.resync_at = Some(self.resync_at.map_or(at_ms, |at| at.min(at_ms)));
    }

    /// Take before reading the pool outside an operation; see [`ItemCore::on_look`] and
    /// [`ItemCore::report`].
    pub fn begin_read(&self) -> ReadToken {
        ReadToken(self.generation_changes, self.ops_finished)
    }

    /// The driver found part of the pool lost (some segments of a segmented item vanished
    /// or came back as others) while the rest is intact. From now until the lost part is
    /// reopened: the intact part sells, no Borrow or Return runs, heartbeats report the
    /// intact part (the driver names the lost segments, so the center puts the difference
    /// in doubt), and a resync soon asks the center whether anything was lost at all.
    /// True when this is news. A whole pool lost is [`Mode::Lost`], not this.
    pub fn on_segments_lost(&mut self, ctx: Ctx, notes: &mut Vec<Note>) -> bool {
        if self.segments_lost || self.mode != Mode::Selling {
            return false;
        }
        self.segments_lost = true;
        self.dirty = true;
        // The center must hear of it even if the intact part reads as before (the lost part
        // held nothing): the next report is sent whatever it says.
        self.last_reported = None;
        notes.push(Note::SegmentsLost);
        self.schedule_resync(ctx.now_ms + self.settings.lost_resync_after_ms);
        true
    }

    /// Whether part of the pool is lost ([`ItemCore::on_segments_lost`]).
    pub fn segments_lost(&self) -> bool {
        self.segments_lost
    }

    pub(super) fn set_generation(&mut self, generation: u64) {
        if generation != self.generation {
            self.generation = generation;
            self.generation_changes += 1;
        }
    }

    /// Whether a read that began with `token` is as new as what the rules know of the
    /// pool's generation (an operation may have created the pool meanwhile: the read
    /// would then show it missing).
    pub(super) fn current(&self, token: ReadToken) -> bool {
        token.0 == self.generation_changes
    }

    /// Detects a pool that vanished from the store or came back as another one. The item
    /// goes [`Mode::Lost`] (and a resync is scheduled) the first time. True while lost.
    pub(super) fn check_pool(&mut self, view: &PoolView, ctx: Ctx, notes: &mut Vec<Note>) -> bool {
        if self.generation == 0 {
            if view.generation != 0 {
                self.set_generation(view.generation);
            }
            return self.mode == Mode::Lost;
        }
        if view.generation != self.generation && self.mode != Mode::Lost {
            notes.push(Note::PoolLost { known: self.generation, now: view.generation });
            self.mode = Mode::Lost;
            // The whole pool now: its reopening is the lost pool's.
            self.segments_lost = false;
            self.reopening = false;
            self.schedule_resync(ctx.now_ms + self.settings.lost_resync_after_ms);
        }
        self.mode == Mode::Lost
    }

    /// The rebalancer's look at a pool it just read (after sweeping expired reservations,
    /// which freed `freed` units): loss detection, then the watermark decision. Returns the
    /// operation to queue, if any (never a second Borrow or Return while one is queued).
    /// A read older than the pool's last known generation (`token`) decides nothing.
    pub fn on_look(
        &mut self,
        view: PoolView,
        token: ReadToken,
        freed: u64,
        ctx: Ctx,
        notes: &mut Vec<Note>,
    ) -> Option<OpKind> {
        if freed > 0 {
            self.stock_returned();
        }
        if !self.current(token) || self.reopening {
            return None;
        }
        self.last_view = Some(view);
        if self.check_pool(&view, ctx, notes) || self.segments_lost {
            return None;
        }
        if view.available > 0 && self.shelf != Shelf::Stocked {
            // Units came back through another replica (a cancel, say): sell them here too.
            self.stock_returned();
        }
        let w = self.watermarks_at(ctx.now_ms);
        self.above_high_since = rebalance::above_high_since(view.available, w.high, self.above_high_since, ctx.now_ms);
        let action = rebalance::decide(&Inputs {
            available: view.available,
            watermarks: w,
            prefetch: self.supply.may_prefetch(),
            above_high_since_ms: self.above_high_since,
            now_ms: ctx.now_ms,
            sustain_ms: self.settings.return_sustain_ms,
        });
        match action {
            Action::Borrow(n) if !self.has_queued(|k| matches!(k, OpKind::Borrow { .. })) => {
                Some(OpKind::Borrow { want: n })
            }
            // At the reserve the shelves hold the plan's opening stock: surplus stays on
            // them until the center runs short and asks for it (`ReturnRequested`).
            Action::Return(n)
                if !self.supply.at_reserve && !self.has_queued(|k| matches!(k, OpKind::Return { .. })) =>
            {
                self.above_high_since = None;
                Some(OpKind::Return { max: n })
            }
            _ => None,
        }
    }

    /// The report of a pool read for a heartbeat (`None`: the read failed, or it is older
    /// than the pool's last known generation: `token`). A lost pool is reported lost
    /// without reading it (pass `None`); a pool that vanished is never reported as an
    /// empty one.
    pub fn report(
        &mut self,
        view: Option<PoolView>,
        token: ReadToken,
        ctx: Ctx,
        notes: &mut Vec<Note>,
    ) -> Option<Report> {
        if self.mode == Mode::Lost {
            return Some(Report::Lost);
        }
        let view = view?;
        if !self.current(token) || self.reopening {
            return None;
        }
        if self.segments_lost && (self.busy() || token.1 != self.ops_finished) {
            // The center derives the lost part from this report: only a read no operation
            // changed the pool under (none starts while part of it is lost) tells it.
            return None;
        }
        self.last_view = Some(view);
        if self.check_pool(&view, ctx, notes) { Some(Report::Lost) } else { Some(Report::Counts(view)) }
    }

    /// Whether the pool needs reading for a report (a lost one is reported without).
    pub fn report_needs_read(&self) -> bool {
        self.mode != Mode::Lost
    }

    /// Whether `report` (with the sell rate `rate_milli`) differs from what the center
    /// last acknowledged; a rate counts as changed when it moved by more than a fifth.
    pub fn report_changed(&self, report: &Report, rate_milli: u64) -> bool {
        self.last_reported.as_ref() != Some(report) || rate_report_changed(self.last_reported_rate, rate_milli)
    }

    /// The center acknowledged `report` with `rate_milli`.
    pub fn reported(&mut self, report: Report, rate_milli: u64) {
        self.last_reported = Some(report);
        self.last_reported_rate = rate_milli;
    }

    /// A heartbeat's answer did not list the item in doubt. A lost or in-doubt item is then
    /// reported again at the next heartbeat: if a rolled-back ledger forgot the report that
    /// put its units in doubt, the center marks them again (marking is idempotent), instead
    /// of counting them with the channel while the agent, whose report was acknowledged,
    /// never sends it again.
    pub fn on_not_in_doubt(&mut self) {
        if matches!(self.mode, Mode::Lost | Mode::InDoubt) {
            self.last_reported = None;
        }
    }

    /// The center holds units of the item in doubt for the channel (a heartbeat's answer):
    /// stop selling it. True when this is news.
    /// With part of the pool lost, those units are what the center holds in doubt: the
    /// intact part sells on.
    pub fn on_in_doubt(&mut self) -> bool {
        if self.mode == Mode::Selling && !self.segments_lost {
            self.mode = Mode::InDoubt;
            return true;
        }
        false
    }

    /// `ReturnRequested`: the sale is ending; give back every idle unit and borrow only on
    /// real misses from now on. Returns the operation to queue.
    pub fn on_return_requested(&mut self) -> OpKind {
        self.supply.end_of_sale = true;
        OpKind::Return { max: u64::MAX }
    }

    /// `Restocked`: the center has stock again.
    pub fn on_restocked(&mut self, center_available: u64) {
        self.set_center_available(center_available.max(1));
    }

    /// The resyncs the rebalancer should queue now: the scheduled one once due, and an
    /// operator's resolution that could not finish before (never one already queued).
    pub fn due_resyncs(&mut self, now_ms: i64) -> Vec<OpKind> {
        use super::ops::ResyncWhy;
        let mut kinds = Vec::new();
        let queued = |k: &OpKind, why: ResyncWhy| *k == OpKind::Resync(why);
        if self.resync_due(now_ms) && !self.has_queued(|k| queued(k, ResyncWhy::Scheduled)) {
            kinds.push(OpKind::Resync(ResyncWhy::Scheduled));
        }
        if self.resolution_pending && !self.has_queued(|k| queued(k, ResyncWhy::Resolved)) {
            kinds.push(OpKind::Resync(ResyncWhy::Resolved));
        }
        kinds
    }

    pub(super) fn has_queued(&self, f: impl Fn(&OpKind) -> bool) -> bool {
        self.running.as_ref().is_some_and(|op| f(&op.kind)) || self.queue.iter().any(|q| f(&q.kind))
    }
}
