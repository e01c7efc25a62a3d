//! Bearer tokens: parsing token files and comparing in constant time. Pure: the services
//! read the files and the request metadata, then ask this module.

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
    /// One token for one principal.
    pub fn single(principal: &str, token: &str) -> Result<Self, String> {
        let mut set = Self::default();
        set.add(principal, token)?;
        Ok(set)
    }

    /// `principal:token` entries, one per line or separated by commas; blank lines and
    /// lines starting with `#` are ignored.
    pub fn parse_pairs(text: &str) -> Result<Self, String> {
        let mut set = Self::default();
        for (n, entry) in text.split(['\n', ',']).map(str::trim).enumerate() {
            if entry.is_empty() || entry.starts_with('#') {
                continue;
            }
            let (principal, token) =
                entry.split_once(':').ok_or_else(|| format!("entry {} is not principal:token", n + 1))?;
            set.add(principal.trim(), token.trim())?;
        }
        Ok(set)
    }

    /// Tokens without principals (one per line), all mapped to `principal`.
    pub fn parse_list(principal: &str, text: &str) -> Result<Self, String> {
        let mut set = Self::default();
        for token in text.split(['\n', ',']).map(str::trim).filter(|t| !t.is_empty() && !t.starts_with('#')) {
            set.add(principal, token)?;
        }
        Ok(set)
    }

    fn add(&mut self, principal: &str, token: &str) -> Result<(), String> {
        if token.len() < 16 {
            return Err(format!("token of {principal:?} is shorter than 16 characters"));
        }
        if principal.is_empty() {
            return Err("empty principal".into());
        }
        self.entries.push((principal.to_owned(), token.as_bytes().to_vec()));
        Ok(())
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

    #[test]
    fn token_files_map_tokens_to_principals() {
        let set = TokenSet::parse_pairs("# agents\napp:aaaaaaaaaaaaaaaa\n\nweb: bbbbbbbbbbbbbbbb\n").unwrap();
        assert_eq!(set.find("aaaaaaaaaaaaaaaa"), Some("app"));
        assert_eq!(set.find("bbbbbbbbbbbbbbbb"), Some("web"));
        assert_eq!(set.find("cccccccccccccccc"), None);
        assert!(TokenSet::parse_pairs("app-without-token").is_err());
        assert!(TokenSet::parse_pairs("app:short").is_err());
        let list = TokenSet::parse_list("backend", "xxxxxxxxxxxxxxxx,yyyyyyyyyyyyyyyy").unwrap();
        assert_eq!(list.find("yyyyyyyyyyyyyyyy"), Some("backend"));
        assert!(!format!("{set:?}").contains("aaaa"), "tokens never printed");
    }
}
