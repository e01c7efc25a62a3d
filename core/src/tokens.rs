//! Token files checked as a whole: a server reads every token source it is given (files,
//! flags, variables), hands their texts here, and starts only if they agree with one
//! another. Pure: the services read the files and their modes; this module decides.
//!
//! Refused, each with one line naming the source and the entries (never a token):
//! a malformed entry, a token shorter than [`MIN_TOKEN_LEN`], a source without any token,
//! the same token listed twice (in one source or across sources, e.g. for two channels,
//! or an operator's token reused as an agent's or a backend's), and a file readable by
//! group or others ([`mode_problem`]).

use crate::auth::TokenSet;

/// Shortest token accepted, in bytes: 16 random hex characters are 64 bits, beyond
/// guessing through a network port. `openssl rand -hex 24` gives 48.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a source's entries look like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `principal:token` entries (agents' tokens by channel).
    Pairs,
    /// Bare tokens, all held by the source's principal (operators', backends').
    List,
    /// Exactly one token (the agent's own token towards the center).
    Single,
}

/// One token source as read: `name` says where it came from (a file's path or a flag).
#[derive(Debug, Clone)]
pub struct Source<'a> {
    pub name: String,
    /// Who holds the tokens of a `List` or `Single` source ("operator", "backend").
    pub principal: &'a str,
    pub format: Format,
    pub text: &'a str,
    /// A file (lines are numbered) or a flag or variable (entries are numbered).
    pub is_file: bool,
}

struct Entry {
    source: usize,
    at: String,
    principal: String,
    token: String,
}

/// Parses every source and checks them together: one [`TokenSet`] per source, in the
/// order given, or the first problem as one line.
pub fn check(sources: &[Source<'_>]) -> Result<Vec<TokenSet>, String> {
    let mut entries = Vec::new();
    for (i, s) in sources.iter().enumerate() {
        let before = entries.len();
        parse(i, s, &mut entries)?;
        let found = entries.len() - before;
        if found == 0 {
            return Err(format!("{}: no token", s.name));
        }
        if s.format == Format::Single && found > 1 {
            return Err(format!("{}: {found} tokens where one is expected", s.name));
        }
    }
    for (a, first) in entries.iter().enumerate() {
        if let Some(second) = entries[a + 1..].iter().find(|e| e.token == first.token) {
            return Err(duplicate(sources, first, second));
        }
    }
    let mut sets = vec![TokenSet::default(); sources.len()];
    for e in entries {
        sets[e.source].push(&e.principal, &e.token);
    }
    Ok(sets)
}

fn parse(index: usize, s: &Source<'_>, out: &mut Vec<Entry>) -> Result<(), String> {
    let mut n = 0;
    for (line_no, line) in s.text.lines().enumerate() {
        // A file's comment is a whole line; flags and variables have none.
        if s.is_file && line.trim_start().starts_with('#') {
            continue;
        }
        // A single token is the whole line: a comma in it is part of the token.
        let parts: Vec<&str> = if s.format == Format::Single { vec![line] } else { line.split(',').collect() };
        for raw in parts {
            n += 1;
            let raw = raw.trim();
            if raw.is_empty() {
                continue;
            }
            let at = if s.is_file { format!("line {}", line_no + 1) } else { format!("entry {n}") };
            let (principal, token) = match s.format {
                Format::Pairs => match raw.split_once(':') {
                    Some((p, t)) if !p.trim().is_empty() => (p.trim().to_owned(), t.trim()),
                    _ => return Err(format!("{}: {at} is not channel:token", s.name)),
                },
                Format::List | Format::Single => (s.principal.to_owned(), raw),
            };
            if token.len() < MIN_TOKEN_LEN {
                let whose = if s.format == Format::Pairs { format!(" (channel {principal})") } else { String::new() };
                return Err(format!(
                    "{}: {at}{whose}: token shorter than {MIN_TOKEN_LEN} characters ({} given)",
                    s.name,
                    token.len()
                ));
            }
            out.push(Entry { source: index, at, principal, token: token.to_owned() });
        }
    }
    Ok(())
}

fn describe(sources: &[Source<'_>], e: &Entry) -> String {
    let s = &sources[e.source];
    match s.format {
        Format::Pairs => format!("{} {} (channel {})", s.name, e.at, e.principal),
        Format::List | Format::Single => format!("{} {} ({})", s.name, e.at, e.principal),
    }
}

fn duplicate(sources: &[Source<'_>], first: &Entry, second: &Entry) -> String {
    let roles = (first.principal.as_str(), sources[first.source].format, sources[second.source].format);
    let what = match roles {
        ("operator", Format::List, Format::Pairs) => "an operator's token reused as an agent's",
        ("operator", Format::List, Format::List) if sources[second.source].principal != "operator" => {
            "an operator's token reused as a backend's"
        }
        _ => "the same token listed twice",
    };
    format!("{what}: {} and {}", describe(sources, first), describe(sources, second))
}

/// Why a token file with these permission bits (`st_mode`) must not be read: readable or
/// writable by group or others. None when only its owner may.
pub fn mode_problem(name: &str, mode: u32) -> Option<String> {
    (mode & 0o077 != 0).then(|| {
        format!(
            "{name}: mode {:03o} lets group or others read it; chmod 600 it (or pass --allow-readable-token-files)",
            mode & 0o777
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaa";
    const B: &str = "bbbbbbbbbbbbbbbb";
    const C: &str = "cccccccccccccccc";

    fn file<'a>(name: &str, principal: &'a str, format: Format, text: &'a str) -> Source<'a> {
        Source { name: name.into(), principal, format, text, is_file: true }
    }

    fn err(sources: &[Source<'_>]) -> String {
        let e = check(sources).expect_err("refused");
        for t in [A, B, C] {
            assert!(!e.contains(t), "a token in the message: {e}");
        }
        e
    }

    #[test]
    fn consistent_files_give_one_set_each() {
        let sets = check(&[
            file("ops", "operator", Format::List, &format!("# ops\n{A}\n")),
            file("agents", "", Format::Pairs, &format!("app:{B}\n\nweb: {C}\n")),
        ])
        .unwrap();
        assert_eq!(sets[0].find(A), Some("operator"));
        assert_eq!(sets[1].find(B), Some("app"));
        assert_eq!(sets[1].find(C), Some("web"));
        assert_eq!(sets[1].find(A), None);
    }

    #[test]
    fn a_token_for_two_channels_is_refused_naming_both_lines() {
        let text = format!("app:{A}\n# web\nweb:{A}\n");
        let e = err(&[file("/etc/agents", "", Format::Pairs, &text)]);
        assert_eq!(
            e,
            "the same token listed twice: /etc/agents line 1 (channel app) and /etc/agents line 3 (channel web)"
        );
    }

    #[test]
    fn an_operator_token_reused_by_an_agent_or_a_backend_is_refused() {
        let ops = A.to_owned();
        let agents = format!("app:{B}\nweb:{A}");
        let e = err(&[file("ops", "operator", Format::List, &ops), file("agents", "", Format::Pairs, &agents)]);
        assert_eq!(
            e,
            "an operator's token reused as an agent's: ops line 1 (operator) and agents line 2 (channel web)"
        );
        let e = err(&[file("ops", "operator", Format::List, &ops), file("backends", "backend", Format::List, &ops)]);
        assert!(e.starts_with("an operator's token reused as a backend's: ops line 1"), "{e}");
    }

    #[test]
    fn the_agents_own_token_may_not_be_a_backend_token() {
        let e = err(&[
            file("backends", "backend", Format::List, &format!("{B}\n{A}\n")),
            file("center.token", "center", Format::Single, A),
        ]);
        assert_eq!(e, "the same token listed twice: backends line 2 (backend) and center.token line 1 (center)");
    }

    #[test]
    fn empty_short_and_malformed_entries_are_refused() {
        assert_eq!(err(&[file("t", "center", Format::Single, "\n  \n")]), "t: no token");
        assert_eq!(err(&[file("t", "operator", Format::List, "# only a comment\n")]), "t: no token");
        assert_eq!(
            err(&[file("t", "center", Format::Single, "short")]),
            "t: line 1: token shorter than 16 characters (5 given)"
        );
        assert_eq!(
            err(&[file("a", "", Format::Pairs, &format!("app:{A}\nweb:tiny"))]),
            "a: line 2 (channel web): token shorter than 16 characters (4 given)"
        );
        assert_eq!(err(&[file("a", "", Format::Pairs, A)]), "a: line 1 is not channel:token");
        assert_eq!(err(&[file("a", "", Format::Pairs, &format!(":{A}"))]), "a: line 1 is not channel:token");
        let two = format!("{A}\n{B}");
        assert_eq!(err(&[file("t", "center", Format::Single, &two)]), "t: 2 tokens where one is expected");
    }

    #[test]
    fn flags_number_their_entries() {
        let text = format!("app:{A},web:{A}");
        let e = err(&[Source {
            name: "--agent-tokens".into(),
            principal: "",
            format: Format::Pairs,
            text: &text,
            is_file: false,
        }]);
        assert_eq!(
            e,
            "the same token listed twice: --agent-tokens entry 1 (channel app) and --agent-tokens entry 2 (channel web)"
        );
    }

    #[test]
    fn files_readable_by_group_or_others_are_named() {
        assert_eq!(mode_problem("t", 0o100600), None);
        assert_eq!(mode_problem("t", 0o100400), None);
        let e = mode_problem("/etc/t", 0o100644).unwrap();
        assert!(e.starts_with("/etc/t: mode 644 lets group or others read it"), "{e}");
        assert!(mode_problem("t", 0o100640).is_some());
        assert!(mode_problem("t", 0o100602).is_some());
    }
}
