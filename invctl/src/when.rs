//! Instants and durations on the command line, and how they are shown. An instant is RFC
//! 3339 (`2026-12-24T20:00:00Z`, `2026-12-24T21:00:00.5+01:00`), relative to now (`+30s`,
//! `+500ms`, `+5m`, `+2h`, `+1d`), or a word: `now` (open at once) or `none` (no end); a
//! duration is `30s`, `500ms`, `2m`, `1h` (a bare number is milliseconds).

/// A parsed `--opens-at` / `--closes-at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Milliseconds since 1970.
    At(i64),
    /// This many milliseconds after now (the center's clock where it is known).
    In(i64),
    /// 0 on the wire: `now` for an opening, `none` for an end.
    Zero,
}

impl When {
    /// The wire value at `now_ms`.
    pub fn resolve(self, now_ms: i64) -> i64 {
        match self {
            When::At(t) => t,
            When::In(d) => now_ms.saturating_add(d),
            When::Zero => 0,
        }
    }
}

/// clap value parser of an instant.
pub fn when(s: &str) -> Result<When, String> {
    let s = s.trim();
    match s {
        "now" | "none" | "0" => return Ok(When::Zero),
        _ => {}
    }
    if let Some(rest) = s.strip_prefix('+') {
        let ms = duration_ms(rest)?;
        return i64::try_from(ms).map(When::In).map_err(|_| format!("{s:?} is too far ahead"));
    }
    rfc3339(s).map(When::At)
}

/// clap value parser of a duration, in milliseconds.
pub fn duration(s: &str) -> Result<u64, String> {
    duration_ms(s.trim())
}

fn duration_ms(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a duration like 30s, 500ms, 5m, 2h or 1d");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let per = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(per).ok_or_else(bad)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` to milliseconds since 1970.
pub fn rfc3339(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not a time like 2026-12-24T20:00:00Z (RFC 3339), +30s, now or none");
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let num = |from: usize, to: usize| -> Result<i64, String> {
        let part = s.get(from..to).ok_or_else(bad)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    let (y, mo, d, h, mi, se) = (num(0, 4)?, num(5, 7)?, num(8, 10)?, num(11, 13)?, num(14, 16)?, num(17, 19)?);
    let month_days = [
        31,
        if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&mo)
        || d < 1
        || d > month_days[usize::try_from(mo - 1).map_err(|_| bad())?]
        || h > 23
        || mi > 59
        || se > 59
    {
        return Err(bad());
    }
    let mut rest = &s[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let first3: String = frac[..digits].chars().chain("000".chars()).take(3).collect();
        millis = first3.parse::<i64>().map_err(|_| bad())?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && matches!(&rest[..1], "+" | "-") && &rest[3..4] == ":" => {
            let sign = if rest.starts_with('-') { -1 } else { 1 };
            let oh: i64 = rest[1..3].parse().map_err(|_| bad())?;
            let om: i64 = rest[4..6].parse().map_err(|_| bad())?;
            if oh > 23 || om > 59 {
                return Err(bad());
            }
            sign * (oh * 60 + om)
        }
        _ => return Err(bad()),
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3_600 + mi * 60 + se - offset_min * 60;
    Ok(secs * 1_000 + millis)
}

/// Milliseconds since 1970 as RFC 3339 in UTC (milliseconds shown when not 0).
pub fn show(ms: i64) -> String {
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let (h, mi, s, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1_000 % 60, in_day % 1_000);
    if milli == 0 {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
    }
}

/// A span for a countdown: `2d 03h 04m 05s`, `4m 05.2s`, `0.8s`.
pub fn span(ms: i64) -> String {
    let ms = ms.max(0);
    let (d, h, m, s) = (ms / 86_400_000, ms / 3_600_000 % 24, ms / 60_000 % 60, ms / 1_000 % 60);
    let tenths = ms / 100 % 10;
    match (d, h, m) {
        (0, 0, 0) => format!("{s}.{tenths}s"),
        (0, 0, _) => format!("{m}m {s:02}.{tenths}s"),
        (0, _, _) => format!("{h}h {m:02}m {s:02}s"),
        _ => format!("{d}d {h:02}h {m:02}m {s:02}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_round_trip_and_bad_ones_are_named() {
        assert_eq!(rfc3339("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(rfc3339("2026-12-24T20:00:00Z"), Ok(1_798_142_400_000));
        assert_eq!(rfc3339("2026-12-24T21:00:00.5+01:00"), Ok(1_798_142_400_500));
        assert_eq!(rfc3339("2024-02-29T00:00:00Z").map(show), Ok("2024-02-29T00:00:00Z".into()));
        assert_eq!(show(1_798_142_400_500), "2026-12-24T20:00:00.500Z");
        for bad in
            ["2026-02-30T00:00:00Z", "2026-12-24 20:00", "tomorrow", "2026-13-01T00:00:00Z", "2026-12-24T20:00:00"]
        {
            assert!(rfc3339(bad).is_err(), "{bad}");
        }
        assert_eq!(when("+30s"), Ok(When::In(30_000)));
        assert_eq!(when("now"), Ok(When::Zero));
        assert_eq!(when("none").map(|w| w.resolve(5)), Ok(0));
        assert_eq!(when("+1m").map(|w| w.resolve(5)), Ok(60_005));
        assert!(when("+soon").is_err() && when("-5s").is_err());
    }

    #[test]
    fn durations_and_countdowns() {
        assert_eq!(duration("30s"), Ok(30_000));
        assert_eq!(duration("500ms"), Ok(500));
        assert_eq!(duration("1500"), Ok(1_500));
        assert_eq!(duration("2h"), Ok(7_200_000));
        assert!(duration("30 s").is_err() && duration("1y").is_err() && duration("").is_err());
        assert_eq!(span(800), "0.8s");
        assert_eq!(span(245_200), "4m 05.2s");
        assert_eq!(span(3_723_000), "1h 02m 03s");
        assert_eq!(span(183_845_000), "2d 03h 04m 05s");
    }
}
