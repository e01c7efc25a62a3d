//! Token sources read for the checks of [`inventory_core::tokens`]: every file and flag a
//! server was given, read together at start and again on SIGHUP.

use std::path::{Path, PathBuf};

use inventory_core::auth::TokenSet;
use inventory_core::tokens::{Format, Source, check, mode_problem};

/// Where one token set comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A flag's (or its variable's) value: `(flag, value)`.
    Value(&'static str, String),
    File(PathBuf),
}

impl Origin {
    /// The flag's value when given, else the file when given.
    pub fn pick(flag: &'static str, value: &Option<String>, file: &Option<PathBuf>) -> Option<Self> {
        match (value, file) {
            (Some(v), _) => Some(Self::Value(flag, v.clone())),
            (None, Some(f)) => Some(Self::File(f.clone())),
            (None, None) => None,
        }
    }
}

/// One token set a server wants: where from, who holds its tokens, its format.
#[derive(Debug, Clone)]
pub struct Spec {
    pub origin: Option<Origin>,
    pub principal: &'static str,
    pub format: Format,
}

/// Reads every configured source and checks them as a whole; an empty set for a source
/// not configured. One line naming the file and entries when refused, never a token.
pub fn load(specs: &[Spec], allow_readable: bool) -> anyhow::Result<Vec<TokenSet>> {
    let mut texts = Vec::new();
    for spec in specs {
        let Some(origin) = &spec.origin else { continue };
        let (name, text, is_file) = match origin {
            Origin::Value(flag, v) => (format!("--{flag}"), v.clone(), false),
            Origin::File(path) => (path.display().to_string(), read_secret(path, allow_readable)?, true),
        };
        texts.push((spec, name, text, is_file));
    }
    let sources: Vec<Source<'_>> = texts
        .iter()
        .map(|(spec, name, text, is_file)| Source {
            name: name.clone(),
            principal: spec.principal,
            format: spec.format,
            text,
            is_file: *is_file,
        })
        .collect();
    let mut checked = check(&sources).map_err(|e| anyhow::anyhow!("token files: {e}"))?.into_iter();
    Ok(specs
        .iter()
        .map(|s| if s.origin.is_some() { checked.next().unwrap_or_default() } else { TokenSet::default() })
        .collect())
}

fn read_secret(path: &Path, allow_readable: bool) -> anyhow::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    if !allow_readable && let Some(problem) = mode_problem(&path.display().to_string(), meta.mode()) {
        anyhow::bail!("token files: {problem}");
    }
    crate::read_text(path)
}
