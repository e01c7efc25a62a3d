//! A ledger behind its pools: the rule that tells a drift in flight from a ledger that lost
//! commits (an asynchronous standby promoted, a backup restored), sampled by the center
//! (`center/src/history.rs`) and by the simulator's center alike.
//!
//! Drift (held − the pool a channel last reported) is normal while a Borrow or Return is
//! on its way to the pool and the pool's next report is on its way back. A drift
//! **persists** when it kept the same non-zero value at every sample for `stuck_after`,
//! `held` was steady as long, and a report came in since `held` last changed (the pool has
//! spoken since, and still differs): a channel that keeps reporting cannot hide it. A
//! persisting negative drift means the pools hold units the ledger does not count with
//! their channel; while any persists for an item, the center lends none of it
//! ([`beyond_ledger`]) and re-learns the units from the report ([`super::relearn`]).
//!
//! A busy channel's `held` never stands still for long (it borrows every second or so),
//! so a negative drift is also judged on its own ([`DriftTrack::pool_beyond`]): a pool
//! holds more than the ledger counts with its channel only when the ledger lost commits,
//! or when its report was read before a Return (or reclaim) the ledger has applied since,
//! since every grant is counted by the ledger before the pool shelves it and every
//! Return is taken from the pool before the ledger counts it. So a negative drift in a
//! report that arrived [`QUIET_MS`] or more after the ledger's units out (returned +
//! reclaimed) last moved is a ledger behind its pool, at once, whatever `held` does.

use super::Allocation;

/// How long after a channel's returned or reclaimed units last moved its reports are
/// trusted to show a pool beyond the ledger on their own: longer than a report can take
/// from the pool's read to the center (a heartbeat's deadline), so no report read before
/// a Return the ledger has applied counts.
pub const QUIET_MS: i64 = 10_000;

/// What a sampler knows of one channel's allocation of one item between samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriftTrack {
    pub held: u64,
    /// `held` had its current value at every sample since this time (0: since before the
    /// first sample).
    pub held_steady_since: i64,
    /// The drift at the last sample, and since when every sample saw that value.
    pub drift: i64,
    pub drift_since: i64,
    /// Units out of the channel's holding (returned + reclaimed), and since when every
    /// sample saw that value (from the first sample on: what came before is unknown).
    pub out: u64,
    pub out_steady_since: i64,
}

impl DriftTrack {
    /// The track after a sample of `a` at `now_ms`; `previous_sample_ms` is when the
    /// sample before this one was taken (`None`: this is the first).
    pub fn observe(track: Option<DriftTrack>, a: &Allocation, previous_sample_ms: Option<i64>, now_ms: i64) -> Self {
        let held = a.held();
        let drift = a.drift();
        let out = a.returned.saturating_add(a.reclaimed);
        let fresh = DriftTrack {
            held,
            held_steady_since: previous_sample_ms.unwrap_or(0),
            drift,
            drift_since: now_ms,
            out,
            out_steady_since: now_ms,
        };
        let mut track = track.unwrap_or(fresh);
        if track.held != held {
            // It changed after the previous sample: its report may be on its way.
            track = DriftTrack {
                drift_since: track.drift_since,
                drift: track.drift,
                out: track.out,
                out_steady_since: track.out_steady_since,
                ..fresh
            };
        }
        if track.out != out {
            (track.out, track.out_steady_since) = (out, now_ms);
        }
        if track.drift != drift {
            (track.drift, track.drift_since) = (drift, now_ms);
        }
        track
    }

    /// Whether the drift of `a` is a broken promise rather than something in flight (see
    /// the module comment). Units in doubt never count.
    pub fn persists(&self, a: &Allocation, now_ms: i64, stuck_after_ms: i64) -> bool {
        self.drift != 0
            && a.in_doubt == 0
            && now_ms - self.drift_since >= stuck_after_ms
            && now_ms - self.held_steady_since >= stuck_after_ms
            && a.reported_at_ms > self.held_steady_since
    }
}

impl DriftTrack {
    /// Whether `a`'s pool holds more than the ledger counts with its channel by a report
    /// no Return or reclaim can explain (see the module comment): its units out have not
    /// moved for [`QUIET_MS`] before the report arrived. Units in doubt never count.
    pub fn pool_beyond(&self, a: &Allocation) -> bool {
        a.drift() < 0
            && a.in_doubt == 0
            && self.out == a.returned.saturating_add(a.reclaimed)
            && a.reported_at_ms >= self.out_steady_since.saturating_add(QUIET_MS)
    }

    /// A negative drift the center must act on now: it persists, or the pool is beyond
    /// the ledger by a report alone.
    pub fn ledger_behind(&self, a: &Allocation, now_ms: i64, stuck_after_ms: i64) -> bool {
        a.drift() < 0 && (self.persists(a, now_ms, stuck_after_ms) || self.pool_beyond(a))
    }
}

/// Whether a negative drift holds the item's lending back while the sampler cannot yet
/// tell a stale report from a lost commit: for [`QUIET_MS`] after it started, after its
/// database came back, or after it reached another database server (`trusted_from_ms`),
/// it knows nothing of the Returns applied
/// before, and a center just restarted on a promoted standby is exactly where a ledger
/// went back. Lending waits; nothing is re-learned until [`DriftTrack::ledger_behind`].
pub fn hold_back(a: &Allocation, now_ms: i64, trusted_from_ms: i64) -> bool {
    now_ms < trusted_from_ms && a.drift() < 0 && a.in_doubt == 0
}

/// Units of an item the pools hold beyond what the ledger counts with their channels:
/// the sum of its persisting negative drifts. While it is above 0 the center lends none
/// of the item.
pub fn beyond_ledger(persisting_drifts: impl IntoIterator<Item = i64>) -> u64 {
    persisting_drifts.into_iter().filter(|d| *d < 0).map(i64::unsigned_abs).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::PoolCounts;

    const STUCK_AFTER: i64 = 7_000;

    fn allocation(granted: u64, reported: u64, reported_at_ms: i64) -> Allocation {
        Allocation {
            granted,
            reported: PoolCounts { available: reported, ..Default::default() },
            reported_at_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_drift_that_keeps_its_value_after_a_report_persists_though_the_channel_keeps_reporting() {
        // The ledger lost 20 units of grants at 10 s; the pool reports every second.
        let a = allocation(20, 40, 17_500);
        let t = DriftTrack {
            held: 20,
            held_steady_since: 10_000,
            drift: -20,
            drift_since: 10_000,
            out: 0,
            out_steady_since: 0,
        };
        assert!(t.persists(&a, 17_600, STUCK_AFTER));
        assert!(!t.persists(&a, 16_000, STUCK_AFTER), "not for long enough yet");
        // A drift whose value moved lately, or with no report since held moved, is in flight.
        assert!(!DriftTrack { drift_since: 15_000, ..t }.persists(&a, 17_600, STUCK_AFTER));
        assert!(!t.persists(&allocation(20, 40, 9_000), 17_600, STUCK_AFTER));
        // None at all, or units in doubt: nothing to say.
        assert!(!DriftTrack { drift: 0, ..t }.persists(&allocation(20, 20, 17_500), 17_600, STUCK_AFTER));
        let lost = Allocation { in_doubt: 20, ..a };
        assert!(!t.persists(&lost, 17_600, STUCK_AFTER));
    }

    #[test]
    fn samples_follow_held_and_the_drift_and_a_rollback_is_caught_after_stuck_after() {
        // Sampled every 2 s. Granted 40, the pool reports 40: no drift.
        let a = allocation(40, 40, 1_000);
        let t = DriftTrack::observe(None, &a, None, 2_000);
        assert_eq!((t.held, t.held_steady_since, t.drift, t.drift_since), (40, 0, 0, 2_000));
        // The ledger goes back to 20 granted between samples; the pool reports 40 again.
        let behind = allocation(20, 40, 4_500);
        let t = DriftTrack::observe(Some(t), &behind, Some(2_000), 4_000);
        assert_eq!((t.held, t.held_steady_since, t.drift, t.drift_since), (20, 2_000, -20, 4_000));
        let mut t = t;
        for now in [6_000, 8_000, 10_000] {
            t = DriftTrack::observe(Some(t), &behind, Some(now - 2_000), now);
            assert!(!t.persists(&behind, now, STUCK_AFTER), "in flight at {now}");
        }
        t = DriftTrack::observe(Some(t), &behind, Some(10_000), 12_000);
        assert_eq!(t.drift_since, 4_000, "the same value since the rollback was seen");
        assert!(t.persists(&behind, 12_000, STUCK_AFTER));
        assert_eq!(beyond_ledger([t.drift, 3, 0]), 20, "positive drifts are stranded stock, not lent twice");
        // A grant moving held (and a drift that changes with it) starts over.
        let granted = allocation(30, 40, 12_500);
        let t = DriftTrack::observe(Some(t), &granted, Some(12_000), 14_000);
        assert_eq!((t.held_steady_since, t.drift, t.drift_since), (12_000, -10, 14_000));
        assert!(!t.persists(&granted, 14_000, STUCK_AFTER));
    }

    #[test]
    fn a_pool_beyond_the_ledger_is_seen_at_once_though_held_keeps_moving_but_not_after_a_return() {
        // Sampled every 2 s from 0; the channel borrows between every two samples.
        let mut t = DriftTrack::observe(None, &allocation(40, 40, 500), None, 0);
        for (i, now) in [2_000, 4_000, 6_000, 8_000, 10_000].into_iter().enumerate() {
            let granted = 40 + 10 * i as u64;
            t = DriftTrack::observe(Some(t), &allocation(granted, granted, now - 500), Some(now - 2_000), now);
            assert!(!t.ledger_behind(&allocation(granted, granted, now - 500), now, STUCK_AFTER));
        }
        // The ledger lost a grant of 20: the next reports show the pool 20 beyond it.
        let behind = allocation(100, 120, 11_500);
        t = DriftTrack::observe(Some(t), &behind, Some(10_000), 12_000);
        assert!(!t.persists(&behind, 12_000, STUCK_AFTER), "held moved: the old rule waits");
        assert!(t.pool_beyond(&behind) && t.ledger_behind(&behind, 12_000, STUCK_AFTER));
        assert_eq!(beyond_ledger([behind.drift()]), 20);

        // A Return the ledger applied after the pool's report was read: the same drift is
        // a stale report, until the units out have stood still for QUIET_MS.
        let returned = Allocation { returned: 20, ..allocation(120, 120, 13_500) };
        t = DriftTrack::observe(Some(t), &returned, Some(12_000), 14_000);
        assert_eq!(returned.drift(), -20);
        assert!(!t.pool_beyond(&returned), "a report read before the Return");
        let later = Allocation { reported_at_ms: 14_000 + QUIET_MS, ..returned };
        assert!(t.pool_beyond(&later), "no Return explains a report that late");
        // Units in doubt or no excess: nothing.
        assert!(!t.pool_beyond(&Allocation { in_doubt: 5, ..later }));
        assert!(!t.pool_beyond(&Allocation { returned: 40, ..later }), "the units out moved since the sample");

        // A sampler that just started (or whose database just came back) holds lending
        // back on any negative drift until it can tell.
        assert!(hold_back(&returned, 14_000, 14_000 + QUIET_MS));
        assert!(!hold_back(&returned, 14_000 + QUIET_MS, 14_000 + QUIET_MS));
        assert!(!hold_back(&allocation(120, 120, 13_500), 14_000, 14_000 + QUIET_MS));
    }
}
