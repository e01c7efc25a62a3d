//! Parsing of command-line values: durations and the loopback-only rule for targets.

use std::net::IpAddr;
use std::time::Duration;

/// `10s`, `500ms`, `2m`, or a plain number of seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let value: f64 = number.trim().parse().map_err(|_| format!("{s:?} is not a duration (like 10s, 500ms, 2m)"))?;
    if !(value.is_finite() && value >= 0.0) {
        return Err(format!("{s:?} is not a duration (like 10s, 500ms, 2m)"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

/// A share in [0, 1].
pub fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}

/// `LOW/HIGH/BATCH`, e.g. `250/1000/500`.
pub fn parse_watermarks(s: &str) -> Result<(u64, u64, u64), String> {
    let parts: Vec<u64> =
        s.split('/').map(|p| p.trim().parse::<u64>()).collect::<Result<_, _>>().map_err(|_| bad(s))?;
    match parts.as_slice() {
        [low, high, batch] if low < high && *batch > 0 => Ok((*low, *high, *batch)),
        _ => Err(bad(s)),
    }
}

fn bad(s: &str) -> String {
    format!("{s:?} is not LOW/HIGH/BATCH with LOW < HIGH and BATCH > 0")
}

/// The host of `scheme://[user[:pass]@]host[:port][/path][?query]`; empty when absent.
pub fn url_host(url: &str) -> &str {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = host_port.strip_prefix('[') {
        return v6.split(']').next().unwrap_or("");
    }
    host_port.split(':').next().unwrap_or("")
}

/// Benchmarks send traffic to this machine only: 127.0.0.0/8, ::1 or localhost (an
/// empty host means a local socket, unless a `host=` query parameter names another).
pub fn ensure_loopback(what: &str, url: &str) -> Result<(), String> {
    let host = url_host(url);
    let local = match host {
        "" => !url.contains("host="),
        "localhost" => true,
        h => h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()),
    };
    if local {
        Ok(())
    } else {
        Err(format!("{what} {url:?}: benchmarks only target this machine (127.0.0.1, ::1 or localhost)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1_500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_share("0.05"), Ok(0.05));
        assert!(parse_share("1.5").is_err());
        assert_eq!(parse_watermarks("250/1000/500"), Ok((250, 1_000, 500)));
        assert!(parse_watermarks("1000/250/500").is_err());
        assert!(parse_watermarks("1/2").is_err());
    }

    #[test]
    fn only_loopback_targets() {
        assert_eq!(url_host("postgres://postgres@127.0.0.1:5432/postgres"), "127.0.0.1");
        assert_eq!(url_host("http://[::1]:50052"), "::1");
        assert_eq!(url_host("redis://:secret@localhost:6379/0"), "localhost");
        for ok in ["http://127.0.0.1:50052", "redis://127.0.0.2", "http://[::1]:1", "postgres://u@localhost/db"] {
            assert!(ensure_loopback("x", ok).is_ok(), "{ok}");
        }
        for bad in
            ["http://10.0.0.1:50052", "http://example.com", "postgres://u@192.168.1.2/db", "postgres:///db?host=db"]
        {
            assert!(ensure_loopback("x", bad).is_err(), "{bad}");
        }
    }
}
