//! Domain identifiers, parsed once at the edge. Inside the system an invalid id cannot
//! exist: every constructor validates.

use std::fmt;

/// Upper bound for any single quantity on the wire (and for an item's total).
pub const MAX_QUANTITY: u64 = 1_000_000_000;

/// Values longer than this are cut in error messages so a hostile 10 KB id cannot flood
/// logs or replies.
const SHOWN_VALUE_CHARS: usize = 40;

/// A request field that failed validation. The message names the field and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {value}: {reason}")]
pub struct ValidationError {
    pub field: String,
    /// The offending value as shown in the message: quoted and escaped for strings,
    /// shortened when long.
    pub value: String,
    pub reason: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, value: impl ShowValue, reason: impl Into<String>) -> Self {
        Self { field: field.into(), value: value.show(), reason: reason.into() }
    }
}

/// How a rejected value appears in an error message.
pub trait ShowValue {
    fn show(&self) -> String;
}

impl ShowValue for &str {
    fn show(&self) -> String {
        if self.chars().count() <= SHOWN_VALUE_CHARS {
            format!("{self:?}")
        } else {
            let head: String = self.chars().take(SHOWN_VALUE_CHARS).collect();
            format!("{head:?}... ({} bytes)", self.len())
        }
    }
}

impl ShowValue for &String {
    fn show(&self) -> String {
        self.as_str().show()
    }
}

impl ShowValue for u64 {
    fn show(&self) -> String {
        self.to_string()
    }
}

impl ShowValue for i64 {
    fn show(&self) -> String {
        self.to_string()
    }
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

fn check_token(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, value, "must not be empty"));
    }
    if value.len() > max {
        return Err(ValidationError::new(field, value, format!("must be at most {max} bytes")));
    }
    if !value.bytes().all(is_token_char) {
        return Err(ValidationError::new(field, value, format!("must match [A-Za-z0-9._:-]{{1,{max}}}")));
    }
    Ok(())
}

macro_rules! token_id {
    ($(#[$doc:meta])* $name:ident, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub const MAX_LEN: usize = $max;

            /// Parses `value`, naming `field` in the error.
            pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
                check_token(field, value, Self::MAX_LEN)?;
                Ok(Self(value.to_owned()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

token_id!(
    /// What is sold: `[A-Za-z0-9._:-]{1,64}`.
    ItemId,
    64
);
token_id!(
    /// A sales entrance with its own agent: `[A-Za-z0-9._:-]{1,32}`.
    Channel,
    32
);
token_id!(
    /// One agent process of a channel: `[A-Za-z0-9._:-]{1,64}`.
    AgentId,
    64
);
token_id!(
    /// A client-chosen id that makes a mutation exactly-once (request_id,
    /// idempotency_key, reservation_id): `[A-Za-z0-9._:-]{1,64}`.
    RequestId,
    64
);

/// A buyer: 1-128 bytes of printable ASCII without spaces (0x21-0x7E). Data, never code.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserId(String);

impl UserId {
    pub const MAX_LEN: usize = 128;

    pub fn parse(field: &str, value: &str) -> Result<Self, ValidationError> {
        if value.is_empty() {
            return Err(ValidationError::new(field, value, "must not be empty"));
        }
        if value.len() > Self::MAX_LEN {
            return Err(ValidationError::new(field, value, "must be at most 128 bytes"));
        }
        if !value.bytes().all(|b| (0x21..=0x7e).contains(&b)) {
            return Err(ValidationError::new(field, value, "must be printable ascii without spaces"));
        }
        Ok(Self(value.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A positive quantity of units, at most [`MAX_QUANTITY`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Quantity(u64);

impl Quantity {
    pub fn parse(field: &str, value: u64) -> Result<Self, ValidationError> {
        if value == 0 {
            return Err(ValidationError::new(field, value, "must be at least 1"));
        }
        if value > MAX_QUANTITY {
            return Err(ValidationError::new(field, value, format!("must be at most {MAX_QUANTITY}")));
        }
        Ok(Self(value))
    }

    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_id_accepts_the_documented_charset() {
        assert!(ItemId::parse("item_id", "skin:dragon-01.v2_A").is_ok());
        assert!(ItemId::parse("item_id", &"a".repeat(64)).is_ok());
    }

    #[test]
    fn item_id_rejects_bad_values_naming_field_and_value() {
        for bad in ["", "has space", "semi;colon", "quote'", "nul\0", "é"] {
            let err = ItemId::parse("item_id", bad).unwrap_err();
            assert_eq!(err.field, "item_id");
            assert!(err.to_string().starts_with("invalid item_id "), "{err}");
        }
        let err = ItemId::parse("item_id", &"a".repeat(65)).unwrap_err();
        assert!(err.to_string().contains("at most 64 bytes"), "{err}");
    }

    #[test]
    fn long_values_are_shortened_in_messages() {
        let err = ItemId::parse("item_id", &"x".repeat(10_000)).unwrap_err();
        let text = err.to_string();
        assert!(text.len() < 200, "{text}");
        assert!(text.contains("10000 bytes"), "{text}");
    }

    #[test]
    fn channel_is_at_most_32_bytes() {
        assert!(Channel::parse("channel", &"c".repeat(32)).is_ok());
        assert!(Channel::parse("channel", &"c".repeat(33)).is_err());
    }

    #[test]
    fn user_id_is_printable_ascii_without_spaces() {
        assert!(UserId::parse("user_id", "u!#$%&'()*+,-./~").is_ok());
        assert!(UserId::parse("user_id", "a b").is_err());
        assert!(UserId::parse("user_id", "tab\t").is_err());
        assert!(UserId::parse("user_id", "").is_err());
        assert!(UserId::parse("user_id", &"u".repeat(129)).is_err());
    }

    #[test]
    fn quantity_bounds() {
        assert!(Quantity::parse("quantity", 0).is_err());
        assert_eq!(Quantity::parse("quantity", 1).unwrap().get(), 1);
        assert!(Quantity::parse("quantity", MAX_QUANTITY).is_ok());
        let err = Quantity::parse("quantity", MAX_QUANTITY + 1).unwrap_err();
        assert_eq!(err.to_string(), "invalid quantity 1000000001: must be at most 1000000000");
    }
}
