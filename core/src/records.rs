//! How long the center keeps request records (the first answer to each request id), and
//! which replays it refuses for that. Pure: the pruner and the Borrow/Return handlers
//! pass the clock in.
//!
//! A record is what makes a replay answer instead of apply again; once pruned, a replay
//! would apply twice. So records are kept [`kept_ms`] (the bound plus a quarter of it,
//! room for the callers' clocks to run ahead of the center's), and a request whose id says
//! it was made longer than the bound ago is refused ([`too_old`]) whether or not its
//! record is still there. The agent's request ids end in a UUID v7, whose first 48 bits
//! are the time it was made ([`made_at_ms`]); ids without one are not refused for age.

/// Default bound: a day. An agent settles a call with no answer within seconds of the
/// center answering again (its resync), so only an agent cut off from the center for a
/// day meets it; its replay is then refused and the resync aligns its pool with what the
/// center counts as held.
pub const DEFAULT_MAX_AGE_MS: u64 = 24 * 60 * 60 * 1000;

/// When the request id was made (ms since 1970), if it ends in a UUID v7 (32 hex digits,
/// version 7, RFC 9562 variant).
pub fn made_at_ms(request_id: &str) -> Option<u64> {
    let tail = request_id.get(request_id.len().checked_sub(32)?..)?;
    let b = tail.as_bytes();
    let hex = b.iter().all(u8::is_ascii_hexdigit);
    let v7 = b[12] == b'7' && matches!(b[16].to_ascii_lowercase(), b'8' | b'9' | b'a' | b'b');
    if !hex || !v7 {
        return None;
    }
    u64::from_str_radix(&tail[..12], 16).ok()
}

/// Why a request is refused for age (FAILED_PRECONDITION): made more than `max_age_ms`
/// before `now_ms`. None when it is younger, or its id tells no time.
pub fn too_old(request_id: &str, now_ms: i64, max_age_ms: u64) -> Option<String> {
    let made = i64::try_from(made_at_ms(request_id)?).ok()?;
    let age = u64::try_from(now_ms.saturating_sub(made)).ok()?;
    (age > max_age_ms).then(|| {
        format!(
            "request_id {request_id:?} was made {age} ms ago, longer than request records are kept \
             (--request-max-age-ms {max_age_ms}): not applied again; the agent's resync aligns its pool"
        )
    })
}

/// How long a record is kept: the bound plus a quarter of it (callers' clocks may run
/// ahead of the center's by up to that quarter and their old requests still be refused).
pub fn kept_ms(max_age_ms: u64) -> u64 {
    max_age_ms.saturating_add(max_age_ms / 4)
}

/// Records created before this (center clock, ms) may go.
pub fn prune_before(now_ms: i64, max_age_ms: u64) -> i64 {
    now_ms.saturating_sub(i64::try_from(kept_ms(max_age_ms)).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A UUID v7 made at 0x0193_8a1b_2c3d ms.
    const V7: &str = "01938a1b2c3d7abc8def0123456789ab";
    const MADE: i64 = 0x0193_8a1b_2c3d;

    #[test]
    fn the_time_comes_from_a_trailing_uuid_v7() {
        assert_eq!(made_at_ms(V7), Some(0x0193_8a1b_2c3d));
        assert_eq!(made_at_ms(&format!("back-{V7}")), Some(0x0193_8a1b_2c3d));
        // Version 4, a wrong variant, not hex, too short: no time.
        assert_eq!(made_at_ms("01938a1b2c3d4abc8def0123456789ab"), None);
        assert_eq!(made_at_ms("01938a1b2c3d7abc0def0123456789ab"), None);
        assert_eq!(made_at_ms("01938a1b2c3d7abc8def0123456789ag"), None);
        assert_eq!(made_at_ms("b1"), None);
        assert_eq!(made_at_ms("borrow-é-01938a1b2c3d7abc8def0123456789"), None);
    }

    #[test]
    fn a_replay_past_the_bound_is_refused_naming_id_and_bound() {
        assert_eq!(too_old(V7, MADE + 1_000, 1_000), None, "at the bound");
        let why = too_old(V7, MADE + 1_001, 1_000).expect("past the bound");
        assert!(why.contains(V7) && why.contains("--request-max-age-ms 1000") && why.contains("1001 ms ago"), "{why}");
        assert_eq!(too_old(V7, MADE - 5_000, 1_000), None, "made in the caller's future");
        assert_eq!(too_old("plain-id", i64::MAX, 1), None, "no time, no refusal");
    }

    #[test]
    fn records_outlive_the_bound_by_a_quarter() {
        assert_eq!(kept_ms(DEFAULT_MAX_AGE_MS), 30 * 60 * 60 * 1000);
        assert_eq!(prune_before(10_000, 4_000), 5_000);
        // A record pruned is always older than the refusal bound plus the clock margin:
        // a request made at `made` (caller's clock, up to a quarter ahead) and recorded at
        // or after it is refused before its record can go.
        let (max, made) = (4_000u64, 1_000i64);
        let recorded = made - 1_000; // the caller's clock ran 1 s (a quarter) ahead
        let first_pruned_at = recorded + i64::try_from(kept_ms(max)).unwrap() + 1;
        assert!(too_old(&format!("{:012x}7abc8def0123456789ab", made), first_pruned_at, max).is_some());
    }
}
