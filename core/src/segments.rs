//! Segmented stock: one channel's pool of a hot item split into several pools, each under
//! its own Redis hash tag so that a Redis Cluster spreads them over its masters.
//!
//! The rules here are pure: which segment a request goes to, how a segment's pool is
//! named, how reservation ids name their segment, and how many units a move between
//! segments takes from which sibling.

use crate::ValidationError;

/// More segments than this buys nothing on any cluster worth running and multiplies the
/// per-item state, reports and moves.
pub const MAX_SEGMENTS: u32 = 64;

/// `CreateItem.segments`: 0 means 1 (one pool).
pub fn parse(field: &str, value: u32) -> Result<u32, ValidationError> {
    match value {
        0 => Ok(1),
        n if n > MAX_SEGMENTS => {
            Err(ValidationError::new(field, u64::from(n), format!("must be between 1 and {MAX_SEGMENTS}")))
        }
        n => Ok(n),
    }
}

/// The segment serving `user_id` among `segments`. Stable across processes and releases
/// (FNV-1a, not the std hasher, whose keys are random per process): every replica of a
/// channel, and every replay of an idempotency key (it comes from the same user), reaches
/// the same segment, so a user's holdings and with them the per-user limit live in one
/// segment.
pub fn route(user_id: &str, segments: u32) -> u32 {
    if segments <= 1 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in user_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // The remainder is below `segments`, a u32.
    u32::try_from(h % u64::from(segments)).unwrap_or(0)
}

/// The Redis hash tag of a segment's pool: segment 0 keeps the one-pool tag
/// `{channel:item}`, so existing pools and one-segment items are unchanged; segment s > 0
/// is `{channel:item#s}` (`#` is outside the id charsets, so no other pool can collide).
pub fn hash_tag(channel: &str, item_id: &str, segment: u32) -> String {
    if segment == 0 { format!("{{{channel}:{item_id}}}") } else { format!("{{{channel}:{item_id}#{segment}}}") }
}

/// A reservation id of segment s > 0 carries the segment as a prefix `s<segment>.`, so
/// Confirm, Cancel, Refund, Extend and GetReservation find its pool without a lookup;
/// segment 0's ids are unchanged.
pub fn tag_reservation_id(segment: u32, reservation_id: &str) -> String {
    if segment == 0 { reservation_id.to_owned() } else { format!("s{segment}.{reservation_id}") }
}

/// The segment a reservation id names and the pool's own id, or `None` when the prefix
/// names a segment the item does not have.
pub fn split_reservation_id(reservation_id: &str, segments: u32) -> Option<(u32, &str)> {
    let Some(rest) = reservation_id.strip_prefix('s') else { return Some((0, reservation_id)) };
    let Some((num, own)) = rest.split_once('.') else { return Some((0, reservation_id)) };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) || num.starts_with('0') {
        return Some((0, reservation_id));
    }
    let segment: u32 = num.parse().ok()?;
    (segment < segments.max(1)).then_some((segment, own))
}

/// A move between two segments of one channel's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: u32,
    pub to: u32,
    pub quantity: u64,
}

/// Which sibling gives how many units to the segment `to`, whose Acquire of `need` units
/// found it empty. The richest sibling gives half its available units (rounded up), at
/// least `need` when it has them: one move serves more than one miss, and the donor keeps
/// stock for its own buyers. `None` when no sibling has any.
pub fn plan_move(to: u32, need: u64, available: &[(u32, u64)]) -> Option<Move> {
    let (from, have) = available
        .iter()
        .filter(|(s, a)| *s != to && *a > 0)
        .max_by_key(|(s, a)| (*a, std::cmp::Reverse(*s)))
        .copied()?;
    let quantity = have.div_ceil(2).max(need.min(have));
    Some(Move { from, to, quantity })
}

/// One segment as a heartbeat reports it, for display (the console): the loss rule uses
/// the pool's sums and its lost segments ([`crate::loss::PoolReport`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SegmentCounts {
    pub segment: u32,
    pub counts: crate::ledger::PoolCounts,
    /// The store lost the segment (the counts are then what is there now).
    pub lost: bool,
}

/// The center's stored form of a pool's segments: `<segment>:<available>/<reserved>/<sold>`
/// (and `!` when lost), comma-separated; "" for an unsegmented pool.
pub fn encode(segments: &[SegmentCounts]) -> String {
    let parts: Vec<String> = segments
        .iter()
        .map(|s| {
            let c = &s.counts;
            format!("{}:{}/{}/{}{}", s.segment, c.available, c.reserved, c.sold, if s.lost { "!" } else { "" })
        })
        .collect();
    parts.join(",")
}

/// [`encode`]'s inverse; `None` when the text is not its output (a corrupted column).
pub fn decode(text: &str) -> Option<Vec<SegmentCounts>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    text.split(',')
        .map(|part| {
            let (part, lost) = part.strip_suffix('!').map_or((part, false), |p| (p, true));
            let (segment, counts) = part.split_once(':')?;
            let mut n = counts.splitn(3, '/').map(str::parse::<u64>);
            let counts = crate::ledger::PoolCounts {
                available: n.next()?.ok()?,
                reserved: n.next()?.ok()?,
                sold: n.next()?.ok()?,
            };
            Some(SegmentCounts { segment: segment.parse().ok()?, counts, lost })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_defaults_and_bounds() {
        assert_eq!(parse("segments", 0), Ok(1));
        assert_eq!(parse("segments", 8), Ok(8));
        assert_eq!(parse("segments", 64), Ok(64));
        let e = parse("segments", 65).unwrap_err();
        assert_eq!(e.field, "segments");
        assert!(e.to_string().contains("65"), "{e}");
    }

    #[test]
    fn routing_is_stable_and_spreads() {
        assert_eq!(route("anyone", 1), 0);
        assert_eq!(route("anyone", 0), 0);
        // Fixed values: a release that changes them would send replays elsewhere.
        assert_eq!(route("user-1", 8), route("user-1", 8));
        let a = route("alice", 8);
        assert_eq!(a, route("alice", 8));
        let mut counts = [0u32; 8];
        for i in 0..8000 {
            counts[route(&format!("u{i}"), 8) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    #[test]
    fn routing_value_is_pinned() {
        // FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c; mod 8 = 4.
        assert_eq!(route("a", 8), 4);
    }

    #[test]
    fn hash_tags_keep_segment_zero() {
        assert_eq!(hash_tag("app", "skin", 0), "{app:skin}");
        assert_eq!(hash_tag("app", "skin", 3), "{app:skin#3}");
    }

    #[test]
    fn reservation_ids_round_trip() {
        assert_eq!(tag_reservation_id(0, "r-1"), "r-1");
        assert_eq!(split_reservation_id("r-1", 8), Some((0, "r-1")));
        let t = tag_reservation_id(5, "r-1");
        assert_eq!(t, "s5.r-1");
        assert_eq!(split_reservation_id(&t, 8), Some((5, "r-1")));
        // A segment the item does not have.
        assert_eq!(split_reservation_id(&t, 4), None);
        // Ids that only look like a prefix stay segment 0's.
        assert_eq!(split_reservation_id("s05.x", 8), Some((0, "s05.x")));
        assert_eq!(split_reservation_id("sx.y", 8), Some((0, "sx.y")));
        assert_eq!(split_reservation_id("s.y", 8), Some((0, "s.y")));
    }

    /// A move is the donor's take and the target's refill under one move id. A crash
    /// between the two is finished by replaying both: the take's replay answers the first
    /// amount and takes nothing more, the refill counts once per id. So the channel's units
    /// (the sum of its segments) are whole again, never doubled. This holds while the
    /// donor still remembers the take (the record retention): an intent left unsettled past
    /// it must not be replayed.
    #[test]
    fn a_move_interrupted_between_take_and_refill_finishes_once() {
        use crate::pool::Pool;
        const RETAIN: i64 = 60_000;
        let (mut donor, mut target) = (Pool::new(), Pool::new());
        donor.refill("grant-1", 9, 1, 1, 0, RETAIN).unwrap();
        target.refill("open-1", 0, 1, 1, 0, RETAIN).unwrap();
        let m = plan_move(1, 1, &[(0, donor.available()), (1, 0)]).unwrap();
        assert_eq!(m, Move { from: 0, to: 1, quantity: 5 });
        let taken = donor.take_for_return("move-1", m.quantity, 1, 10, RETAIN).unwrap();
        assert_eq!(taken, 5);
        // The agent dies here: 5 units are in neither segment. On restart both steps are
        // replayed with the same id.
        assert_eq!(donor.available() + target.available(), 4);
        let again = donor.take_for_return("move-1", m.quantity, 1, 20, RETAIN).unwrap();
        assert_eq!(again, taken, "a replayed take answers the first amount");
        assert!(target.refill_existing("move-1", again, 1, 20, RETAIN).unwrap());
        assert!(!target.refill_existing("move-1", again, 1, 30, RETAIN).unwrap(), "a replayed refill counts once");
        assert_eq!((donor.available(), target.available()), (4, 5));
    }

    #[test]
    fn moves_take_from_the_richest_sibling() {
        assert_eq!(plan_move(0, 1, &[(0, 0), (1, 0), (2, 0)]), None);
        assert_eq!(plan_move(0, 1, &[(0, 5)]), None);
        assert_eq!(plan_move(0, 1, &[(0, 0), (1, 3), (2, 9)]), Some(Move { from: 2, to: 0, quantity: 5 }));
        // At least the need when the donor has it, never more than it has.
        assert_eq!(plan_move(1, 4, &[(0, 5)]), Some(Move { from: 0, to: 1, quantity: 4 }));
        assert_eq!(plan_move(1, 9, &[(0, 5)]), Some(Move { from: 0, to: 1, quantity: 5 }));
        assert_eq!(plan_move(1, 1, &[(0, 1)]), Some(Move { from: 0, to: 1, quantity: 1 }));
    }

    #[test]
    fn segment_counts_round_trip_through_their_stored_form() {
        use crate::ledger::PoolCounts;
        assert_eq!(encode(&[]), "");
        assert_eq!(decode(""), Some(Vec::new()));
        let segs = [
            SegmentCounts { segment: 0, counts: PoolCounts { available: 4, reserved: 1, sold: 2 }, lost: false },
            SegmentCounts { segment: 7, counts: PoolCounts::default(), lost: true },
            SegmentCounts {
                segment: 63,
                counts: PoolCounts { available: u64::MAX, reserved: 0, sold: 9 },
                lost: false,
            },
        ];
        let text = encode(&segs);
        assert_eq!(text, format!("0:4/1/2,7:0/0/0!,63:{}/0/9", u64::MAX));
        assert_eq!(decode(&text), Some(segs.to_vec()));
        for bad in ["0:1/2", "x:1/2/3", "0:1/2/3/4", "0-1/2/3", ",", "0:1/2/-3"] {
            assert_eq!(decode(bad), None, "{bad}");
        }
    }
}
