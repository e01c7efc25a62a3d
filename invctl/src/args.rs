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

#[cfg(test)]
mod tests {
    use super::*;

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
