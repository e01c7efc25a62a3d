//! Records the git commit the binaries are built from (`INVENTORY_GIT_HASH`), for
//! `--version` and the `inventory_build_info` metric. A build outside a git checkout (a
//! source tarball) or without git installed says "unknown" instead of failing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let hash = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=INVENTORY_GIT_HASH={hash}");
    // Rebuild when HEAD moves: HEAD itself (a checkout), the branch it names (a commit),
    // and packed refs (a gc). Worktrees keep HEAD apart from the shared refs.
    let (Some(git_dir), Some(common)) =
        (git(&["rev-parse", "--absolute-git-dir"]), git(&["rev-parse", "--git-common-dir"]))
    else {
        return;
    };
    let git_dir = PathBuf::from(git_dir);
    let common = if Path::new(&common).is_absolute() {
        PathBuf::from(common)
    } else {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(common)
    };
    let mut watched = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(common.join(branch));
    }
    for path in watched.into_iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}
