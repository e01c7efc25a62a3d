//! The plan of a sale: when an item opens, when it closes, how long before the opening the
//! channels stock their pools, and how many units the center keeps back.
//!
//! Every instant here is the **center's clock** (milliseconds since 1970): an agent
//! passes its estimate of the center's time, bounded from below (see [`CenterClock`]), so
//! a fast agent clock never opens a sale early.

use crate::ValidationError;

/// How long before the opening the agents stock their pools when CreateItem leaves
/// `prestock_lead_ms` 0: long enough for every channel's Borrow to land under load, short
/// enough that units do not sit idle on shelves for long.
pub const DEFAULT_PRESTOCK_LEAD_MS: u64 = 30_000;
/// The longest lead accepted: a day.
pub const MAX_PRESTOCK_LEAD_MS: u64 = 86_400_000;
/// The latest instant accepted (9999-12-31T23:59:59.999Z): larger values are typing
/// errors (seconds taken for milliseconds times a thousand, say), not plans.
pub const MAX_UNIX_MS: i64 = 253_402_300_799_999;
/// The center's default reserve: this share of the total, in percent (rounded down).
pub const DEFAULT_RESERVE_PERCENT: u64 = 5;

/// An item's schedule. `opens_at_ms` 0: on sale from its creation; `closes_at_ms` 0: no
/// end. An opening in the past is an opening now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub opens_at_ms: i64,
    pub closes_at_ms: i64,
    pub prestock_lead_ms: u64,
}

impl Default for Schedule {
    fn default() -> Self {
        Self { opens_at_ms: 0, closes_at_ms: 0, prestock_lead_ms: DEFAULT_PRESTOCK_LEAD_MS }
    }
}

/// Where a sale stands at an instant of the center's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the opening: nothing is sold.
    NotStarted {
        opens_at_ms: i64,
    },
    Open,
    /// At or after `closes_at`: sold as a closed item (SOLD_OUT).
    Closed,
}

/// The schedule's phase at `center_now_ms`.
pub fn phase(s: &Schedule, center_now_ms: i64) -> Phase {
    phase_within(s, CenterNow::exact(center_now_ms))
}

/// The center's time now as an agent knows it: between two bounds (see [`CenterClock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CenterNow {
    pub earliest_ms: i64,
    pub latest_ms: i64,
}

impl CenterNow {
    /// Nothing measured yet: every scheduled item is before its opening and past its end.
    pub const UNKNOWN: CenterNow = CenterNow { earliest_ms: i64::MIN, latest_ms: i64::MAX };

    pub fn exact(ms: i64) -> Self {
        Self { earliest_ms: ms, latest_ms: ms }
    }
}

/// The phase when the center's time is only known within bounds: the sale opens by the
/// earliest the center's clock may read (never early) and closes by the latest (never
/// late); each may come one round trip of the measurement off the other way.
pub fn phase_within(s: &Schedule, now: CenterNow) -> Phase {
    if s.closes_at_ms > 0 && now.latest_ms >= s.closes_at_ms {
        Phase::Closed
    } else if s.opens_at_ms > 0 && now.earliest_ms < s.opens_at_ms {
        Phase::NotStarted { opens_at_ms: s.opens_at_ms }
    } else {
        Phase::Open
    }
}

impl Schedule {
    /// Whether the item has a schedule at all (an opening or an end).
    pub fn is_scheduled(&self) -> bool {
        self.opens_at_ms > 0 || self.closes_at_ms > 0
    }

    /// Whether the item has opened by `center_now_ms` (also when it has closed since).
    pub fn opened(&self, center_now_ms: i64) -> bool {
        self.opens_at_ms <= center_now_ms
    }

    /// When the channels start stocking: `opens_at − prestock_lead` (0 when unscheduled).
    pub fn stocking_starts_at_ms(&self) -> i64 {
        if self.opens_at_ms == 0 {
            return 0;
        }
        self.opens_at_ms.saturating_sub(i64::try_from(self.prestock_lead_ms).unwrap_or(i64::MAX))
    }

    /// Whether pools may take stock from the center at `center_now_ms`: from the start of
    /// the lead on (never before, so units stay at the center until the plan says).
    pub fn may_stock(&self, center_now_ms: i64) -> bool {
        self.opens_at_ms == 0 || center_now_ms >= self.stocking_starts_at_ms()
    }
}

/// A time field: 0 (none) or an instant between 1970 and the year 9999.
pub fn parse_time(field: &str, value: i64) -> Result<i64, ValidationError> {
    if !(0..=MAX_UNIX_MS).contains(&value) {
        return Err(ValidationError::new(
            field,
            value,
            format!("must be 0 or milliseconds since 1970 up to {MAX_UNIX_MS} (year 9999)"),
        ));
    }
    Ok(value)
}

/// `prestock_lead_ms`: 0 means [`DEFAULT_PRESTOCK_LEAD_MS`]; at most a day.
pub fn parse_lead(value: u64) -> Result<u64, ValidationError> {
    match value {
        0 => Ok(DEFAULT_PRESTOCK_LEAD_MS),
        n if n > MAX_PRESTOCK_LEAD_MS => {
            Err(ValidationError::new("prestock_lead_ms", n, format!("must be at most {MAX_PRESTOCK_LEAD_MS} (a day)")))
        }
        n => Ok(n),
    }
}

/// The times of a schedule, checked against each other and `now_ms`: `closes_at` after
/// `opens_at` and in the future.
fn parse_times(opens_at: i64, closes_at: i64, now_ms: i64) -> Result<(i64, i64), ValidationError> {
    let opens_at = parse_time("opens_at_unix_ms", opens_at)?;
    let closes_at = parse_time("closes_at_unix_ms", closes_at)?;
    if closes_at > 0 {
        if opens_at > 0 && closes_at <= opens_at {
            return Err(ValidationError::new(
                "closes_at_unix_ms",
                closes_at,
                format!("must be after opens_at_unix_ms {opens_at}"),
            ));
        }
        if closes_at <= now_ms {
            return Err(ValidationError::new(
                "closes_at_unix_ms",
                closes_at,
                format!("must be in the future (now {now_ms}); close an item now with CloseItem"),
            ));
        }
    }
    Ok((opens_at, closes_at))
}

/// CreateItem's schedule at `now_ms` (the center's clock).
pub fn parse(opens_at: i64, closes_at: i64, prestock_lead_ms: u64, now_ms: i64) -> Result<Schedule, ValidationError> {
    let (opens_at_ms, closes_at_ms) = parse_times(opens_at, closes_at, now_ms)?;
    Ok(Schedule { opens_at_ms, closes_at_ms, prestock_lead_ms: parse_lead(prestock_lead_ms)? })
}

/// `center_reserve`: absent means [`DEFAULT_RESERVE_PERCENT`] of the total; at most the
/// total.
pub fn parse_reserve(value: Option<u64>, total: u64) -> Result<u64, ValidationError> {
    match value {
        None => Ok(total / 100 * DEFAULT_RESERVE_PERCENT + total % 100 * DEFAULT_RESERVE_PERCENT / 100),
        Some(n) if n > total => {
            Err(ValidationError::new("center_reserve", n, format!("must be at most the total {total}")))
        }
        Some(n) => Ok(n),
    }
}

/// A channel's opening allocation: what it stocks at the start of the lead. The total less
/// the center's reserve, split evenly over `channels` (those selling when the lead starts,
/// by name), the first ones by name taking one more unit each of the remainder; 0 for a
/// channel not among them (it starts from the reserve after the opening).
pub fn opening_allocation(total: u64, reserve: u64, channels: &[&str], channel: &str) -> u64 {
    let mut sorted: Vec<&str> = channels.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let Some(index) = sorted.iter().position(|c| *c == channel) else { return 0 };
    let (n, index) = (u64::try_from(sorted.len()).unwrap_or(u64::MAX), u64::try_from(index).unwrap_or(u64::MAX));
    let shared = total.saturating_sub(reserve);
    shared / n + u64::from(index < shared % n)
}

/// The most a Borrow of a channel holding `held` may take at `center_now_ms` by the plan
/// alone: `None` once the item opened (or without an opening: the ordinary rules apply);
/// before the lead 0 (units stay at the center until the plan says); during the lead the
/// channel's opening allocation (`allocation`, as [`opening_allocation`] or the shares
/// split it now) less what it holds, so only the opening's stocking leaves the center
/// before the opening and nothing reaches a shelf early that the plan did not put there.
pub fn room_before_opening(s: &Schedule, center_now_ms: i64, allocation: u64, held: u64) -> Option<u64> {
    if s.opens_at_ms == 0 || s.opened(center_now_ms) {
        None
    } else if !s.may_stock(center_now_ms) {
        Some(0)
    } else {
        Some(allocation.saturating_sub(held))
    }
}

/// Why a schedule cannot move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RescheduleError {
    Invalid(ValidationError),
    /// The item opened already: only `closes_at` may move.
    Opened {
        opens_at_ms: i64,
    },
}

impl From<ValidationError> for RescheduleError {
    fn from(e: ValidationError) -> Self {
        Self::Invalid(e)
    }
}

/// SetSchedule at `now_ms`: before the opening both times move (an opening now or in the
/// past opens the item now); once the item has opened only `closes_at` moves, earlier or
/// later, and `opens_at` must be the one it opened at (or 0, the same: it is open).
pub fn reschedule(current: &Schedule, opens_at: i64, closes_at: i64, now_ms: i64) -> Result<Schedule, RescheduleError> {
    let (opens_at_ms, closes_at_ms) = parse_times(opens_at, closes_at, now_ms)?;
    if current.opened(now_ms) {
        if opens_at_ms != 0 && opens_at_ms != current.opens_at_ms {
            return Err(RescheduleError::Opened { opens_at_ms: current.opens_at_ms });
        }
        if closes_at_ms > 0 && current.opens_at_ms > 0 && closes_at_ms <= current.opens_at_ms {
            let reason = format!("must be after opens_at_unix_ms {}", current.opens_at_ms);
            return Err(ValidationError::new("closes_at_unix_ms", closes_at_ms, reason).into());
        }
        return Ok(Schedule { closes_at_ms, ..*current });
    }
    Ok(Schedule { opens_at_ms, closes_at_ms, ..*current })
}

/// The agent's estimate of the center's clock, from answers that carry the center's time.
///
/// A call sent at `sent_ms` and answered at `received_ms` (the agent's clock) carries the
/// center's time `center_ms`, read somewhere in between. Then the center's clock is ahead
/// of the agent's by at least `center_ms − received_ms` and at most `center_ms − sent_ms`,
/// so `local_now + offset_ms ≤ center_now ≤ local_now + offset_ms + round_trip_ms` as long
/// as neither clock jumped since the measurement. Sales open by the lower bound (never
/// early, at most one round trip late) and close by the upper one (never late, at most
/// one round trip early). Each new measurement replaces the last, so a clock that jumped
/// is trusted again after the next answer (a heartbeat every third of the lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CenterClock {
    /// Center time minus agent time, at least.
    pub offset_ms: i64,
    /// The round trip of the measurement: the most the estimate is behind the center.
    pub round_trip_ms: i64,
}

impl CenterClock {
    pub fn measure(sent_ms: i64, received_ms: i64, center_ms: i64) -> Self {
        Self {
            offset_ms: center_ms.saturating_sub(received_ms),
            round_trip_ms: received_ms.saturating_sub(sent_ms).max(0),
        }
    }

    /// The center's time now, at least, given the agent's time now.
    pub fn center_now_ms(&self, local_now_ms: i64) -> i64 {
        local_now_ms.saturating_add(self.offset_ms)
    }

    /// Both bounds of the center's time now, given the agent's time now.
    pub fn bounds(&self, local_now_ms: i64) -> CenterNow {
        let earliest_ms = self.center_now_ms(local_now_ms);
        CenterNow { earliest_ms, latest_ms: earliest_ms.saturating_add(self.round_trip_ms) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    #[test]
    fn phases_follow_the_center_clock() {
        let s = Schedule { opens_at_ms: NOW + 1_000, closes_at_ms: NOW + 5_000, prestock_lead_ms: 500 };
        assert_eq!(phase(&s, NOW), Phase::NotStarted { opens_at_ms: NOW + 1_000 });
        assert_eq!(phase(&s, NOW + 999), Phase::NotStarted { opens_at_ms: NOW + 1_000 });
        assert_eq!(phase(&s, NOW + 1_000), Phase::Open);
        assert_eq!(phase(&s, NOW + 4_999), Phase::Open);
        assert_eq!(phase(&s, NOW + 5_000), Phase::Closed);
        assert_eq!(phase(&Schedule::default(), 0), Phase::Open);
        assert!(!s.may_stock(NOW + 499) && s.may_stock(NOW + 500));
        assert!(Schedule::default().may_stock(0) && Schedule::default().may_stock(i64::MIN));
        // Known only within bounds: opens by the earliest, closes by the latest.
        let within = |earliest_ms, latest_ms| phase_within(&s, CenterNow { earliest_ms, latest_ms });
        assert_eq!(within(NOW + 990, NOW + 1_010), Phase::NotStarted { opens_at_ms: NOW + 1_000 });
        assert_eq!(within(NOW + 4_990, NOW + 5_010), Phase::Closed);
        assert_eq!(within(NOW + 1_000, NOW + 4_999), Phase::Open);
        assert_eq!(phase_within(&s, CenterNow::UNKNOWN), Phase::Closed);
        let opens_only = Schedule { closes_at_ms: 0, ..s };
        assert_eq!(phase_within(&opens_only, CenterNow::UNKNOWN), Phase::NotStarted { opens_at_ms: NOW + 1_000 });
        assert_eq!(phase_within(&Schedule::default(), CenterNow::UNKNOWN), Phase::Open);
    }

    #[test]
    fn creation_checks_each_field_and_their_order() {
        assert_eq!(parse(0, 0, 0, NOW).unwrap(), Schedule::default());
        // An opening in the past opens now.
        assert_eq!(phase(&parse(NOW - 10, 0, 0, NOW).unwrap(), NOW), Phase::Open);
        let e = parse(NOW + 10, NOW + 10, 0, NOW).unwrap_err();
        assert_eq!(e.field, "closes_at_unix_ms");
        assert!(e.to_string().contains("must be after opens_at_unix_ms"), "{e}");
        assert_eq!(parse(0, NOW - 1, 0, NOW).unwrap_err().field, "closes_at_unix_ms");
        assert_eq!(parse(-1, 0, 0, NOW).unwrap_err().field, "opens_at_unix_ms");
        assert_eq!(parse(0, i64::MAX, 0, NOW).unwrap_err().field, "closes_at_unix_ms");
        assert_eq!(parse(MAX_UNIX_MS + 1, 0, 0, NOW).unwrap_err().field, "opens_at_unix_ms");
        assert_eq!(parse(0, 0, MAX_PRESTOCK_LEAD_MS + 1, NOW).unwrap_err().field, "prestock_lead_ms");
        assert_eq!(parse(0, 0, MAX_PRESTOCK_LEAD_MS, NOW).unwrap().prestock_lead_ms, MAX_PRESTOCK_LEAD_MS);
    }

    #[test]
    fn the_reserve_defaults_to_five_percent_and_stays_within_the_total() {
        assert_eq!(parse_reserve(None, 3_000).unwrap(), 150);
        assert_eq!(parse_reserve(None, 19).unwrap(), 0);
        assert_eq!(parse_reserve(None, 1_000_000_000).unwrap(), 50_000_000);
        assert_eq!(parse_reserve(Some(0), 10).unwrap(), 0);
        assert_eq!(parse_reserve(Some(10), 10).unwrap(), 10);
        assert_eq!(parse_reserve(Some(11), 10).unwrap_err().field, "center_reserve");
    }

    #[test]
    fn the_opening_stock_is_split_evenly_and_the_reserve_kept() {
        let live = ["web", "app", "eu"];
        let each: Vec<u64> = ["app", "eu", "web"].iter().map(|c| opening_allocation(1_000, 100, &live, c)).collect();
        assert_eq!(each, [300, 300, 300]);
        let each: Vec<u64> = ["app", "eu", "web"].iter().map(|c| opening_allocation(1_000, 99, &live, c)).collect();
        assert_eq!(each, [301, 300, 300], "the remainder to the first by name");
        assert_eq!(opening_allocation(1_000, 100, &live, "late"), 0, "not selling when the lead started");
        assert_eq!(opening_allocation(10, 20, &live, "app"), 0);
        assert_eq!(opening_allocation(10, 0, &[], "app"), 0);
    }

    #[test]
    fn before_the_opening_only_the_opening_stock_leaves_the_center() {
        let s = Schedule { opens_at_ms: NOW + 1_000, closes_at_ms: 0, prestock_lead_ms: 300 };
        assert_eq!(room_before_opening(&s, NOW, 300, 0), Some(0), "before the lead: nothing");
        assert_eq!(room_before_opening(&s, NOW + 699, 300, 0), Some(0));
        assert_eq!(room_before_opening(&s, NOW + 700, 300, 0), Some(300), "the lead: the allocation");
        assert_eq!(room_before_opening(&s, NOW + 900, 300, 120), Some(180), "less what it holds");
        assert_eq!(room_before_opening(&s, NOW + 900, 300, 400), Some(0));
        assert_eq!(room_before_opening(&s, NOW + 900, 0, 0), Some(0), "a channel without an allocation");
        assert_eq!(room_before_opening(&s, NOW + 1_000, 0, 0), None, "opened: the ordinary rules");
        assert_eq!(room_before_opening(&Schedule::default(), NOW, 0, 0), None, "unscheduled");
    }

    #[test]
    fn before_the_opening_everything_moves_after_it_only_the_end() {
        let s = Schedule { opens_at_ms: NOW + 1_000, closes_at_ms: 0, prestock_lead_ms: 30 };
        let moved = reschedule(&s, NOW + 5_000, NOW + 9_000, NOW).unwrap();
        assert_eq!((moved.opens_at_ms, moved.closes_at_ms, moved.prestock_lead_ms), (NOW + 5_000, NOW + 9_000, 30));
        assert_eq!(reschedule(&s, 0, 0, NOW).unwrap().opens_at_ms, 0, "0 opens it now");
        let later = NOW + 2_000;
        assert_eq!(reschedule(&s, NOW + 5_000, 0, later), Err(RescheduleError::Opened { opens_at_ms: NOW + 1_000 }));
        let end = reschedule(&s, NOW + 1_000, NOW + 3_000, later).unwrap();
        assert_eq!((end.opens_at_ms, end.closes_at_ms), (NOW + 1_000, NOW + 3_000));
        let end = reschedule(&end, 0, NOW + 2_500, later).unwrap();
        assert_eq!(end.closes_at_ms, NOW + 2_500, "earlier, and 0 keeps the opening");
        assert!(matches!(reschedule(&end, 0, later - 1, later), Err(RescheduleError::Invalid(_))));
    }

    #[test]
    fn the_clock_estimate_never_runs_ahead_of_the_center() {
        // The agent runs 2 s ahead; the call took 40 ms, the center read its clock at some
        // point in between.
        let skew = 2_000;
        for center_read_at in [0, 20, 40] {
            let c = CenterClock::measure(NOW + skew, NOW + skew + 40, NOW + center_read_at);
            assert_eq!(c.round_trip_ms, 40);
            let local_now = NOW + skew + 1_000;
            let truth = NOW + 1_000;
            let estimate = c.center_now_ms(local_now);
            assert!(estimate <= truth && truth - estimate <= c.round_trip_ms, "{estimate} vs {truth}");
            let b = c.bounds(local_now);
            assert!(b.earliest_ms <= truth && truth <= b.latest_ms, "{b:?} vs {truth}");
        }
    }
}
