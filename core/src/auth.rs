//! Bearer tokens: who holds which, compared in constant time ([`crate::tokens`] parses and
//! checks the files). Pure: the services read the files and the request metadata, then
//! ask this module.

use subtle::ConstantTimeEq;

/// Compares two byte strings without an early exit on the first difference, so the time
/// taken does not tell how much of a guessed token was right. (Lengths are not secret:
/// `subtle` answers unequal lengths at once.)
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    bool::from(a.ct_eq(b))
}

/// The token of an `authorization: Bearer <token>` header value.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token.trim())
}

/// Tokens and who holds them (a channel for agent tokens, a fixed name otherwise).
#[derive(Clone, Default)]
pub struct TokenSet {
    entries: Vec<(String, Vec<u8>)>,
}

impl std::fmt::Debug for TokenSet {
    // Never print tokens.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSet").field("principals", &self.entries.iter().map(|e| &e.0).collect::<Vec<_>>()).finish()
    }
}

impl TokenSet {
    /// Adds an entry; [`crate::tokens::check`] builds sets only after checking them all.
    pub(crate) fn push(&mut self, principal: &str, token: &str) {
        self.entries.push((principal.to_owned(), token.as_bytes().to_vec()));
    }

    /// The token of a set of one (the agent's own token towards the center).
    pub fn sole(&self) -> Option<&str> {
        match self.entries.as_slice() {
            [(_, token)] => std::str::from_utf8(token).ok(),
            _ => None,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Who holds `presented`, checking every entry (no early exit).
    pub fn find(&self, presented: &str) -> Option<&str> {
        let mut found = None;
        for (principal, token) in &self.entries {
            if ct_eq(token, presented.as_bytes()) {
                found = Some(principal.as_str());
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_equality_is_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"abcd"));
        assert!(ct_eq(b"", b""));
    }

    #[test]
    fn bearer_header() {
        assert_eq!(bearer("Bearer t0k"), Some("t0k"));
        assert_eq!(bearer("bearer t0k"), Some("t0k"));
        assert_eq!(bearer("Basic t0k"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Bearer"), None);
    }
}
