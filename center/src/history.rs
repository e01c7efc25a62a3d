//! The console's memory and its reading of drift.
//!
//! The center samples the ledger every `period` (two narrow queries: every item's units at
//! the center, and every ledger line; a catalogue whose read takes more than a quarter of
//! the period is sampled less often) and keeps the last `keep` of samples, so a console opened in the
//! middle of an incident shows how it got there. Samples are kept for the `max_items` items
//! that changed last, which bounds their memory whatever the catalogue's size; what drift
//! needs (one held value and time per channel and item) is kept for every item.
//!
//! Drift (held − the pool a channel last reported) is normal while a Borrow or Return is
//! on its way to the pool and the pool's next report is on its way back. A drift is
//! **stuck** when that cannot explain it: the channel's last report has stood for
//! `stuck_after` and either came after the last change of `held` (so it should have
//! counted it) or is overdue (no report for `stuck_after` since `held` last changed).
//! Agents report a changed pool every third of their lease (about 3.3 s by default), so
//! a drift that outlives `stuck_after` (7 s by default) is not in flight. Units in doubt
//! are shown apart and never count as drift. Whether a drift *persists* (a ledger behind
//! its pools, which stops lending and is re-learned) is `inventory_core::ledger::behind`,
//! which the simulator's center runs too.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use inventory_core::ledger::{Allocation, DriftTrack};
use serde::Serialize;

use crate::store::LedgerStore;

#[derive(Debug, Clone, Copy)]
pub struct HistoryConfig {
    /// How often the ledger is sampled.
    pub period: Duration,
    /// How much history is kept (the console's longest window).
    pub keep: Duration,
    /// How long an unexplained drift may last before it counts as stuck.
    pub stuck_after: Duration,
    /// Items with history (those that changed last).
    pub max_items: usize,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            period: Duration::from_secs(2),
            keep: Duration::from_secs(15 * 60),
            stuck_after: Duration::from_secs(7),
            max_items: 32,
        }
    }
}

/// One channel's pool of one item at one sample.
#[derive(Debug, Clone, Serialize)]
pub struct ChannelSample {
    pub available: u64,
    pub reserved: u64,
    pub sold: u64,
    pub held: u64,
    pub drift: i64,
    pub stuck: bool,
}

/// One item at one sample.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t: i64,
    /// Units at the center.
    pub available: u64,
    pub channels: HashMap<String, ChannelSample>,
}

/// What `/api/history` serves.
#[derive(Debug, Serialize)]
pub struct HistoryView {
    pub period_ms: u64,
    pub keep_ms: u64,
    pub stuck_after_ms: u64,
    pub items: HashMap<String, Vec<Sample>>,
}

/// What the sampler knows of one channel's allocation of one item (`ledger::behind`).
type Track = DriftTrack;

#[derive(Default)]
struct State {
    items: HashMap<String, VecDeque<Sample>>,
    /// Item → channel → track: a sample looks each line up by its names, allocating only
    /// for a line it has not seen.
    tracks: HashMap<String, HashMap<String, Track>>,
    /// Per item: (available, held) at the last sample and when it last changed.
    activity: HashMap<String, ((u64, u64), i64)>,
    /// Stuck drifts of every item at the last sample: (item, channel) → drift.
    stuck: HashMap<(String, String), i64>,
    /// Negative drifts that hold lending back while the sampler cannot tell yet
    /// (`ledger::hold_back`): (item, channel) → drift.
    held_back: HashMap<(String, String), i64>,
    last_sample_ms: Option<i64>,
    /// How long the last sample took (read and bookkeeping).
    last_sample_took: Duration,
    /// Until when negative drifts hold lending back (None: no sample has succeeded since
    /// start, since the database last failed a sample, or since the store reached another
    /// database server).
    trusted_from_ms: Option<i64>,
    /// The store's `database_changes` when the window above was last armed.
    database_changes: u64,
}

impl State {
    /// Whether the window of `ledger::hold_back` must open (again) at the next sample:
    /// none has succeeded yet, or the store's connections reached another server since
    /// (a failover behind a stable address, which no failed read may have shown).
    fn rearm(&mut self, changes: u64) -> bool {
        if changes != self.database_changes {
            self.database_changes = changes;
            self.trusted_from_ms = None;
            tracing::warn!(
                "the ledger's database changed under the center: holding the lending of items whose pools hold more than the ledger counts until their reports are sure"
            );
        }
        self.trusted_from_ms.is_none()
    }
}

pub struct History {
    config: HistoryConfig,
    state: Mutex<State>,
    /// A sample at a report is running (`sample_if_unsure`).
    sampling: std::sync::atomic::AtomicBool,
}

/// A drift split into the part calls and reports in flight explain and the stuck rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DriftSplit {
    pub in_flight: i64,
    pub stuck: i64,
}

impl History {
    pub fn new(config: HistoryConfig) -> Self {
        Self { config, state: Mutex::new(State::default()), sampling: Default::default() }
    }

    pub fn config(&self) -> HistoryConfig {
        self.config
    }

    /// Samples `store` every period until `history` is dropped (its router is gone). A
    /// catalogue whose read takes longer than a fraction of the period is sampled less
    /// often ([`pause_after`]), so the sampler never keeps the database busy.
    pub fn spawn_sampler(history: &Arc<History>, store: Arc<dyn LedgerStore>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let weak: Weak<History> = Arc::downgrade(history);
        let period = history.config.period;
        runtime.spawn(async move {
            let mut pause = Duration::ZERO;
            loop {
                tokio::time::sleep(pause).await;
                let Some(history) = weak.upgrade() else { return };
                let started = std::time::Instant::now();
                if let Err(e) = history.sample(store.as_ref(), crate::clock::now_ms()).await {
                    tracing::debug!(error = %e, "console history: ledger unreadable, sample skipped");
                    history.state.lock().unwrap_or_else(|p| p.into_inner()).trusted_from_ms = None;
                } else {
                    history.relearn_lost_grants(store.as_ref()).await;
                }
                pause = pause_after(period, started.elapsed());
            }
        });
    }

    /// Reads the ledger once and records it.
    pub async fn sample(&self, store: &dyn LedgerStore, now_ms: i64) -> Result<(), crate::error::CenterError> {
        let started = std::time::Instant::now();
        let snapshot = store.sample().await?;
        let mut by_item: HashMap<&str, Vec<(&str, &Allocation)>> = HashMap::new();
        for (item, channel, allocation) in &snapshot.lines {
            by_item.entry(item.as_str()).or_default().push((channel.as_str(), allocation));
        }
        let lines_of = |item: &str| by_item.get(item).map(Vec::as_slice).unwrap_or_default();
        // Saturating, as `ItemRecord::held`: a corrupted ledger shows in Reconcile.
        let held_of = |item: &str| lines_of(item).iter().fold(0u64, |sum, (_, a)| sum.saturating_add(a.held()));
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let previous = state.last_sample_ms;
        state.rearm(store.database_changes());
        let trusted_from = *state.trusted_from_ms.get_or_insert(now_ms + inventory_core::ledger::behind::QUIET_MS);
        let mut held_back = HashMap::new();
        for (item_id, available) in &snapshot.items {
            let key = (*available, held_of(item_id));
            match state.activity.get_mut(item_id) {
                Some(entry) if entry.0 != key => *entry = (key, now_ms),
                Some(_) => {}
                None => {
                    state.activity.insert(item_id.clone(), (key, now_ms));
                }
            }
        }
        let ids: HashSet<&str> = snapshot.items.iter().map(|(id, _)| id.as_str()).collect();
        state.activity.retain(|id, _| ids.contains(id.as_str()));
        // The items that changed last keep (or get) a history.
        let kept = changed_last(state.activity.iter().map(|(id, (_, at))| (id, *at)), self.config.max_items);

        let oldest = now_ms.saturating_sub(millis(self.config.keep));
        let mut stuck = HashMap::new();
        for (item_id, available) in &snapshot.items {
            let with_history = kept.contains(item_id);
            let mut channels = HashMap::new();
            let lines = lines_of(item_id);
            if !lines.is_empty() && !state.tracks.contains_key(item_id.as_str()) {
                state.tracks.insert(item_id.clone(), HashMap::new());
            }
            for (channel, a) in lines {
                let held = a.held();
                let drift = a.drift();
                let tracks = state.tracks.get_mut(item_id.as_str()).expect("inserted above for an item with lines");
                let track = match tracks.get_mut(*channel) {
                    Some(known) => {
                        *known = DriftTrack::observe(Some(*known), a, previous, now_ms);
                        *known
                    }
                    None => {
                        let track = DriftTrack::observe(None, a, previous, now_ms);
                        tracks.insert((*channel).to_owned(), track);
                        track
                    }
                };
                let stuck_after = millis(self.config.stuck_after);
                if track.persists(a, now_ms, stuck_after) || track.ledger_behind(a, now_ms, stuck_after) {
                    stuck.insert((item_id.clone(), (*channel).to_owned()), drift);
                } else if inventory_core::ledger::hold_back(a, now_ms, trusted_from) {
                    held_back.insert((item_id.clone(), (*channel).to_owned()), drift);
                }
                if with_history {
                    let split = split_drift(a, Some(track), now_ms, self.config.stuck_after);
                    let sample = ChannelSample {
                        available: a.reported.available,
                        reserved: a.reported.reserved,
                        sold: a.reported.sold,
                        held,
                        drift: a.drift(),
                        stuck: split.stuck != 0,
                    };
                    channels.insert((*channel).to_owned(), sample);
                }
            }
            if with_history {
                let samples = state.items.entry(item_id.clone()).or_default();
                samples.push_back(Sample { t: now_ms, available: *available, channels });
                while samples.front().is_some_and(|s| s.t < oldest) {
                    samples.pop_front();
                }
            }
        }
        state.items.retain(|id, _| kept.contains(id));
        state.tracks.retain(|id, _| ids.contains(id.as_str()));
        for ((item, channel), drift) in &held_back {
            if !state.held_back.contains_key(&(item.clone(), channel.clone())) {
                tracing::warn!(
                    item = %item,
                    channel = %channel,
                    units = drift.unsigned_abs(),
                    "a pool reports more than the ledger counts and the center cannot tell yet whether a report is in flight or commits were lost: not lending the item meanwhile"
                );
            }
        }
        state.stuck = stuck;
        state.held_back = held_back;
        state.last_sample_ms = Some(now_ms);
        state.last_sample_took = started.elapsed();
        Ok(())
    }

    /// While the sampler cannot yet tell a report in flight from lost commits (just after
    /// the center started, or its database came back: `ledger::hold_back`), a report is
    /// looked at as it arrives rather than at the next sample, so a center restarted on a
    /// ledger that went back holds the item's lending at its pools' first reports. At most
    /// one such sample at a time, and one per 100 ms or per [`SAMPLE_SHARE`] times the last
    /// sample's duration, whichever is longer; the report's call does not wait.
    pub fn sample_if_unsure(history: &Arc<History>, store: &Arc<dyn LedgerStore>, now_ms: i64) {
        {
            let mut state = history.state.lock().unwrap_or_else(|p| p.into_inner());
            let unsure = state.rearm(store.database_changes()) || state.trusted_from_ms.is_some_and(|t| now_ms < t);
            let gap = millis(Duration::from_millis(100).max(state.last_sample_took * SAMPLE_SHARE));
            if !unsure || state.last_sample_ms.is_some_and(|t| now_ms - t < gap) {
                return;
            }
        }
        if history.sampling.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let (history, store) = (Arc::clone(history), Arc::clone(store));
        tokio::spawn(async move {
            if let Err(e) = history.sample(store.as_ref(), now_ms).await {
                tracing::debug!(error = %e, "ledger unreadable, sample at a report skipped");
            }
            history.sampling.store(false, std::sync::atomic::Ordering::Release);
        });
    }

    /// Re-learns, from the pools' reports, grants the ledger lost (stuck negative drifts):
    /// the pools are the witnesses of what they shelved ([`inventory_core::ledger::relearn`]).
    pub async fn relearn_lost_grants(&self, store: &dyn LedgerStore) {
        use inventory_core::ledger::Relearned;
        for (item, channel, drift) in self.stuck_drifts() {
            if drift >= 0 {
                continue;
            }
            let (Ok(item_id), Ok(ch)) =
                (inventory_core::ItemId::parse("item_id", &item), inventory_core::Channel::parse("channel", &channel))
            else {
                continue;
            };
            match store.relearn(&item_id, &ch, drift.unsigned_abs()).await {
                Ok(Relearned::Units(units)) => tracing::error!(
                    item = %item,
                    channel = %channel,
                    units,
                    "the ledger counted fewer units with the channel than its pool holds (lost commits?): re-learned them from its report"
                ),
                Ok(Relearned::Short { units, short }) => tracing::error!(
                    item = %item,
                    channel = %channel,
                    units,
                    short,
                    "the pools hold more than the ledger can account for: units were lent twice before the loss was seen; not lending the item"
                ),
                Ok(Relearned::Nothing) => {}
                Err(e) => {
                    tracing::warn!(item = %item, channel = %channel, error = %e, "re-learning lost grants failed")
                }
            }
        }
    }

    /// The drifts the last sample found stuck: (item, channel, drift), sorted. A negative
    /// one is a pool holding more than the ledger counts with its channel: the ledger lost
    /// commits (or the pool shelved what it was never granted). A positive one is stock
    /// held at the center for a channel and on none of its shelves.
    pub fn stuck_drifts(&self) -> Vec<(String, String, i64)> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<(String, String, i64)> =
            state.stuck.iter().map(|((item, channel), d)| (item.clone(), channel.clone(), *d)).collect();
        all.sort();
        all
    }

    /// Units of `item` that pools hold beyond what the ledger counts with their channels
    /// (stuck negative drifts, at the last sample): while any, the center lends none of it.
    pub fn beyond_ledger(&self, item: &str) -> u64 {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let drifts = state.stuck.iter().chain(&state.held_back).filter(|((i, _), _)| i == item).map(|(_, d)| *d);
        inventory_core::ledger::beyond_ledger(drifts)
    }

    /// Splits the drift of `allocation` (read now) with what the samples know.
    pub fn split(&self, item: &str, channel: &str, allocation: &Allocation, now_ms: i64) -> DriftSplit {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let track = state.tracks.get(item).and_then(|t| t.get(channel)).copied();
        // Held moved after the last sample: whatever it moved is in flight.
        let track = match track {
            Some(t) if t.held != allocation.held() => {
                Some(Track { held: allocation.held(), held_steady_since: now_ms, ..t })
            }
            other => other,
        };
        split_drift(allocation, track, now_ms, self.config.stuck_after)
    }

    pub fn view(&self) -> HistoryView {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        HistoryView {
            period_ms: millis(self.config.period).unsigned_abs(),
            keep_ms: millis(self.config.keep).unsigned_abs(),
            stuck_after_ms: millis(self.config.stuck_after).unsigned_abs(),
            items: state.items.iter().map(|(id, s)| (id.clone(), s.iter().cloned().collect())).collect(),
        }
    }
}

/// The rule (see the module comment). `track: None`: nothing sampled yet, so a held change
/// cannot be ruled out and only the report's age counts.
fn split_drift(a: &Allocation, track: Option<Track>, now_ms: i64, stuck_after: Duration) -> DriftSplit {
    let drift = a.drift();
    let stuck_after = millis(stuck_after);
    let held_steady_since = track.map_or(now_ms, |t| t.held_steady_since);
    let report_is_old = now_ms - a.reported_at_ms >= stuck_after;
    let held_moved_lately = now_ms - held_steady_since < stuck_after;
    let report_counts_the_move = a.reported_at_ms > held_steady_since;
    let in_flight = held_moved_lately && !report_counts_the_move;
    if drift == 0 || a.in_doubt > 0 || in_flight || !report_is_old {
        DriftSplit { in_flight: if a.in_doubt > 0 { 0 } else { drift }, stuck: 0 }
    } else {
        DriftSplit { in_flight: 0, stuck: drift }
    }
}

/// The sampler takes at most one part in this many of the time.
const SAMPLE_SHARE: u32 = 4;

/// The pause after a sample that took `took`: what is left of `period`, or of
/// [`SAMPLE_SHARE`] times `took` when that is longer (a large catalogue's slow read is
/// made less often rather than back to back).
fn pause_after(period: Duration, took: Duration) -> Duration {
    period.max(took * SAMPLE_SHARE).saturating_sub(took)
}

/// The `max` items that changed last (ties by id), of (item, when it last changed).
/// Only those few are ordered: no sort of a whole large catalogue every sample.
fn changed_last<'a>(activity: impl Iterator<Item = (&'a String, i64)>, max: usize) -> HashSet<String> {
    let mut ranked: Vec<(&String, i64)> = activity.collect();
    if ranked.len() > max {
        ranked.select_nth_unstable_by(max, |a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        ranked.truncate(max);
    }
    ranked.into_iter().map(|(id, _)| id.clone()).collect()
}

/// A duration in whole milliseconds (saturating: no configured period is near the limit).
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inventory_core::ledger::PoolCounts;

    const STUCK_AFTER: Duration = Duration::from_secs(7);

    fn allocation(granted: u64, reported: u64, reported_at_ms: i64) -> Allocation {
        Allocation {
            granted,
            reported: PoolCounts { available: reported, ..Default::default() },
            reported_at_ms,
            ..Default::default()
        }
    }

    fn track(held: u64, held_steady_since: i64) -> Option<Track> {
        Some(Track { held, held_steady_since, drift: 0, drift_since: 0, out: 0, out_steady_since: 0 })
    }

    #[test]
    fn another_database_server_opens_the_hold_window_again() {
        let mut state = State::default();
        assert!(state.rearm(0), "before any sample the window is to open");
        state.trusted_from_ms = Some(5_000);
        assert!(!state.rearm(0), "the same server: the window stays as it was");
        assert_eq!(state.trusted_from_ms, Some(5_000));
        assert!(state.rearm(1), "a failover behind the same address opens it again");
        assert_eq!(state.trusted_from_ms, None);
        state.trusted_from_ms = Some(90_000);
        assert!(!state.rearm(1), "counted once");
        // Once open again, a pool beyond the ledger holds its item's lending.
        let beyond = allocation(10, 30, 80_000);
        assert!(inventory_core::ledger::hold_back(&beyond, 85_000, state.trusted_from_ms.unwrap()));
    }

    #[test]
    fn a_borrow_whose_report_is_on_its_way_is_in_flight() {
        // Reported at 1 s, granted 10 more at ~5 s, now 6 s: the report is due.
        let a = allocation(30, 20, 1_000);
        assert_eq!(split_drift(&a, track(30, 5_000), 6_000, STUCK_AFTER), DriftSplit { in_flight: 10, stuck: 0 });
        // Even long after the report was sent, as long as held moved lately.
        assert_eq!(split_drift(&a, track(30, 20_000), 21_000, STUCK_AFTER).stuck, 0);
    }

    #[test]
    fn a_drift_that_a_later_report_does_not_explain_is_stuck_once_the_report_has_stood() {
        // Held steady since 1 s, reported at 2 s with one unit short.
        let a = allocation(10, 9, 2_000);
        assert_eq!(split_drift(&a, track(10, 1_000), 5_000, STUCK_AFTER).stuck, 0, "the report is young");
        assert_eq!(split_drift(&a, track(10, 1_000), 9_000, STUCK_AFTER), DriftSplit { in_flight: 0, stuck: 1 });
    }

    #[test]
    fn an_overdue_report_makes_the_drift_stuck() {
        // A borrow at 1 s that no report ever counted (the agent died).
        let a = allocation(30, 20, 500);
        assert_eq!(split_drift(&a, track(30, 1_000), 7_000, STUCK_AFTER).stuck, 0);
        assert_eq!(split_drift(&a, track(30, 1_000), 8_500, STUCK_AFTER).stuck, 10);
    }

    #[test]
    fn no_drift_and_units_in_doubt_are_never_stuck() {
        let quiet = allocation(10, 10, 0);
        assert_eq!(split_drift(&quiet, track(10, 0), 100_000, STUCK_AFTER), DriftSplit { in_flight: 0, stuck: 0 });
        let lost = Allocation { in_doubt: 10, ..allocation(10, 0, 0) };
        assert_eq!(split_drift(&lost, track(10, 0), 100_000, STUCK_AFTER), DriftSplit { in_flight: 0, stuck: 0 });
    }

    #[test]
    fn a_slow_sample_stretches_the_period_to_a_multiple_of_its_duration() {
        let period = Duration::from_secs(2);
        assert_eq!(pause_after(period, Duration::from_millis(100)), Duration::from_millis(1_900));
        assert_eq!(pause_after(period, Duration::from_millis(500)), Duration::from_millis(1_500));
        // A 1 s read: one every 4 s, so the database is busy with it a quarter of the time.
        assert_eq!(pause_after(period, Duration::from_secs(1)), Duration::from_secs(3));
    }

    #[test]
    fn the_items_kept_are_those_that_changed_last_ties_by_id() {
        let ids: Vec<String> = (0..6).map(|i| format!("item-{i}")).collect();
        let at = [10, 50, 30, 50, 20, 40];
        let kept = |max| changed_last(ids.iter().zip(at), max);
        let names = |v: &[usize]| v.iter().map(|&i| ids[i].clone()).collect::<HashSet<_>>();
        assert_eq!(kept(3), names(&[1, 3, 5]));
        // Two changed at 50: the lower id comes first.
        assert_eq!(kept(1), names(&[1]));
        assert_eq!(kept(6), names(&[0, 1, 2, 3, 4, 5]));
        assert_eq!(kept(10), names(&[0, 1, 2, 3, 4, 5]));
        assert!(kept(0).is_empty());
    }

    #[test]
    fn before_any_sample_a_fresh_change_counts_as_in_flight() {
        let a = allocation(30, 20, 0);
        assert_eq!(split_drift(&a, None, 100_000, STUCK_AFTER).stuck, 0);
    }
}
