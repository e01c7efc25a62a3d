//! The Acquire scripts' calls written straight into one `EVALSHA` command buffer. A
//! `ScriptInvocation` keeps a vector per key and per argument (about 25 allocations for one
//! Acquire) and copies them all into a command again when it is sent; the hot path's calls
//! that need no replica's acknowledgement skip both. Writes that wait for replicas keep the
//! invocation, which `durable.rs` pipelines with its `WAIT`.

use redis::{Cmd, ErrorKind, FromRedisValue, RedisResult, Script, ScriptInvocation, ServerErrorKind, ToRedisArgs};

use super::errors::map_err;
use super::{Conn, StoreError};

/// Where a script call's ARGV go: an [`Evalsha`], or a `ScriptInvocation`.
pub(super) trait Argv {
    fn push<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self;
}

impl Argv for ScriptInvocation<'_> {
    fn push<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.arg(arg);
        self
    }
}

/// One `EVALSHA` of `script` with its KEYS given up front (the command carries their count
/// before them).
pub(super) struct Evalsha<'a> {
    script: &'a Script,
    cmd: Cmd,
}

impl<'a> Evalsha<'a> {
    pub(super) fn new(script: &'a Script, keys: &[&str], argc: usize) -> Self {
        let bytes: usize = keys.iter().map(|k| k.len()).sum::<usize>() + 64 + argc * 24;
        let mut cmd = Cmd::with_capacity(3 + keys.len() + argc, bytes);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Self { script, cmd }
    }

    /// Sends the call; a server that lost the script (NOSCRIPT) is given it and asked
    /// again, as `ScriptInvocation::invoke_async` does.
    pub(super) async fn run<T: FromRedisValue>(&self, conn: Conn) -> Result<T, StoreError> {
        match conn {
            Conn::Single(mut c) => self.query(&mut c).await,
            Conn::Cluster(mut c) => self.query(&mut c).await,
        }
        .map_err(map_err)
    }

    async fn query<T: FromRedisValue>(&self, conn: &mut impl redis::aio::ConnectionLike) -> RedisResult<T> {
        match self.cmd.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            answer => answer,
        }
    }
}

impl Argv for Evalsha<'_> {
    fn push<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

/// The invocation of `script` with `keys`, for the calls that keep it.
pub(super) fn invocation<'a>(script: &'a Script, keys: &[&str]) -> ScriptInvocation<'a> {
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(*key);
    }
    call
}
