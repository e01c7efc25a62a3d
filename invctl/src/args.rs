//! Value parsers for numbers on the command line: a negative number or a zero where it
//! means nothing gets a plain sentence instead of clap's "unexpected argument '-5'".

/// A count of units or milliseconds: 0 or more.
pub fn count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    if let Some(rest) = s.strip_prefix('-') {
        return Err(if rest.parse::<u64>().is_ok() {
            "cannot be negative".into()
        } else {
            format!("{s:?} is not a whole number")
        });
    }
    s.parse::<u64>().map_err(|_| format!("{s:?} is not a whole number of 0 or more"))
}

/// A quantity that must move at least one unit.
pub fn quantity(s: &str) -> Result<u64, String> {
    match count(s)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// `--share CHANNEL=WEIGHT[:cap=N][:floor=N]`: one channel's part of an item's plan.
pub fn share(s: &str) -> Result<inventory_proto::v1::ChannelShare, String> {
    let usage = "expected CHANNEL=WEIGHT[:cap=N][:floor=N], e.g. partner=20:cap=300:floor=100";
    let (channel, rest) = s.split_once('=').ok_or_else(|| format!("{s:?}: {usage}"))?;
    if channel.is_empty() {
        return Err(format!("{s:?}: the channel is missing; {usage}"));
    }
    let mut parts = rest.split(':');
    let weight = count(parts.next().unwrap_or_default()).map_err(|e| format!("weight {e}"))?;
    let mut share = inventory_proto::v1::ChannelShare { channel: channel.to_owned(), weight, ..Default::default() };
    for part in parts {
        match part.split_once('=') {
            Some(("cap", n)) => share.cap_units = count(n).map_err(|e| format!("cap {e}"))?,
            Some(("floor", n)) => share.floor_units = count(n).map_err(|e| format!("floor {e}"))?,
            _ => return Err(format!("{part:?}: {usage}")),
        }
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_read_weight_cap_and_floor() {
        let s = share("partner=20:cap=300:floor=100").unwrap();
        assert_eq!((s.channel.as_str(), s.weight, s.cap_units, s.floor_units), ("partner", 20, 300, 100));
        let s = share("app=50").unwrap();
        assert_eq!((s.weight, s.cap_units, s.floor_units), (50, 0, 0));
        assert!(share("app").unwrap_err().contains("CHANNEL=WEIGHT"));
        assert!(share("=5").unwrap_err().contains("channel is missing"));
        assert!(share("app=-1").unwrap_err().contains("weight cannot be negative"));
        assert!(share("app=1:limit=3").unwrap_err().contains("\"limit=3\""));
        assert!(share("app=1:cap=x").unwrap_err().starts_with("cap "));
    }

    #[test]
    fn negative_zero_and_garbage_are_named() {
        assert_eq!(count("-5"), Err("cannot be negative".into()));
        assert_eq!(count("5"), Ok(5));
        assert_eq!(count("0"), Ok(0));
        assert_eq!(count("x"), Err("\"x\" is not a whole number of 0 or more".into()));
        assert_eq!(count("-x"), Err("\"-x\" is not a whole number".into()));
        assert_eq!(quantity("0"), Err("must be at least 1".into()));
        assert_eq!(quantity("-1"), Err("cannot be negative".into()));
        assert_eq!(quantity("2"), Ok(2));
    }
}
