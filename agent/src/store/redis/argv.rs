//! A script call's KEYS and ARGV, written once for the Acquire scripts whichever way they
//! are sent.

use redis::{Script, ScriptInvocation, ToRedisArgs};

/// Where a script call's ARGV go.
pub(super) trait Argv {
    fn push<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self;
}

impl Argv for ScriptInvocation<'_> {
    fn push<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.arg(arg);
        self
    }
}

/// The invocation of `script` with `keys`.
pub(super) fn invocation<'a>(script: &'a Script, keys: &[&str]) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(*key);
    }
    call
}
