//! Group commit on Acquire: the lane of each pool hands waiting Acquires on to a task
//! that sends them as `acquire_batch.lua` calls until none wait.

use super::*;

#[derive(Default)]
pub(super) struct BatchCounters {
    pub(super) calls: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) largest: AtomicU64,
}

/// How many Acquires went to Redis in batches (`acquire_batch.lua` calls), counted since
/// the store was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    /// Calls of `acquire_batch.lua`.
    pub calls: u64,
    /// Acquires those calls answered.
    pub requests: u64,
    /// The most Acquires one call answered.
    pub largest: u64,
}

/// One pool as the store knows it: its key names, built once, and its group-commit lane.
pub(super) struct PoolEntry {
    /// The pool these keys are of (errors name it).
    pub(super) pool: PoolKey,
    pub(super) keys: Keys,
    pub(super) lane: Mutex<Lane>,
    /// The highest write sequence this store's own writes of the pool were answered with
    /// (`lua/intact.lua`): a pool found below it went back in time.
    pub(super) floor: AtomicU64,
}

impl PoolEntry {
    pub(super) fn new(pool: PoolKey, keys: Keys) -> Self {
        Self { pool, keys, lane: Mutex::new(Lane::default()), floor: AtomicU64::new(0) }
    }

    /// Appends the floor as the script's last ARGV, where `lua/intact.lua` reads it.
    pub(super) fn floor_arg(&self, call: &mut impl Argv) {
        call.push(self.floor.load(Ordering::Acquire));
    }

    /// The reply of a script wrapped by `lua/intact.lua`'s `pool_reply`, `{wseq, reply}`:
    /// the reply, the floor raised to `wseq` (0 when the call changed nothing).
    pub(super) fn acknowledged(&self, v: Value) -> Result<Value, StoreError> {
        self.acknowledged_seq(v).map(|(_, reply)| reply)
    }

    /// [`PoolEntry::acknowledged`], with the `wseq` the call was answered with.
    pub(super) fn acknowledged_seq(&self, v: Value) -> Result<(u64, Value), StoreError> {
        let (wseq, reply) = unwrap_seq(v)?;
        self.floor.fetch_max(wseq, Ordering::AcqRel);
        Ok((wseq, reply))
    }
}

/// `{wseq, reply}` split; a Lua nil reply leaves the table with one element.
pub(super) fn unwrap_seq(v: Value) -> Result<(u64, Value), StoreError> {
    let mut items = array("pool script", v)?.into_iter();
    let wseq = match items.next() {
        Some(Value::Int(n)) => u64::try_from(n).unwrap_or(0),
        other => return Err(StoreError::Protocol(format!("pool script: unexpected write sequence {other:?}"))),
    };
    Ok((wseq, items.next().unwrap_or(Value::Nil)))
}

/// The Acquires of one pool: whether a script call for the pool is in flight, and those
/// waiting for it to finish.
#[derive(Default)]
pub(super) struct Lane {
    pub(super) busy: bool,
    pub(super) waiting: Vec<Waiter>,
}

pub(super) struct Waiter {
    pub(super) args: AcquireArgs,
    pub(super) answer: oneshot::Sender<Result<AcquireResult, StoreError>>,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct BatchConfig {
    pub(super) durability: Option<Durability>,
    pub(super) max: usize,
    pub(super) outbox_max: u64,
}

/// Hands a pool's lane on when the call in flight ends: to a task that sends the waiting
/// Acquires as batches until none wait, or back to idle.
pub(super) struct Handoff {
    pub(super) entry: Arc<PoolEntry>,
    pub(super) shared: Arc<Shared>,
    pub(super) batch: BatchConfig,
}

impl Drop for Handoff {
    fn drop(&mut self) {
        let Some(batch) = next_batch(&self.entry, self.batch.max) else { return };
        let (entry, shared, config) = (Arc::clone(&self.entry), Arc::clone(&self.shared), self.batch);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(send_batches(entry, shared, config, batch));
            }
            Err(_) => {
                // No runtime to send them on: their senders drop, so they answer
                // Unavailable, and the lane is free again.
                drop(batch);
                let mut lane = entry.lane.lock().unwrap_or_else(PoisonError::into_inner);
                lane.busy = false;
                lane.waiting.clear();
            }
        }
    }
}

/// Takes up to `max` waiting Acquires in arrival order, or marks the lane idle if none wait.
pub(super) fn next_batch(entry: &PoolEntry, max: usize) -> Option<Vec<Waiter>> {
    let mut lane = entry.lane.lock().unwrap_or_else(PoisonError::into_inner);
    if lane.waiting.is_empty() {
        lane.busy = false;
        return None;
    }
    let n = lane.waiting.len().min(max);
    Some(lane.waiting.drain(..n).collect())
}

pub(super) async fn send_batches(
    entry: Arc<PoolEntry>,
    shared: Arc<Shared>,
    config: BatchConfig,
    mut batch: Vec<Waiter>,
) {
    loop {
        let answers = send_batch(&entry, &shared, config, &batch).await;
        match answers {
            Ok(answers) => {
                for (waiter, answer) in batch.drain(..).zip(answers) {
                    // A caller that gave up no longer listens; its answer is dropped.
                    let _ = waiter.answer.send(answer);
                }
            }
            Err(e) => {
                for waiter in batch.drain(..) {
                    let _ = waiter.answer.send(Err(copy_err(&e)));
                }
            }
        }
        match next_batch(&entry, config.max) {
            Some(next) => batch = next,
            None => return,
        }
    }
}

/// One call of acquire_batch.lua: one answer per waiter, in order.
pub(super) async fn send_batch(
    entry: &PoolEntry,
    shared: &Shared,
    config: BatchConfig,
    batch: &[Waiter],
) -> Result<Vec<Result<AcquireResult, StoreError>>, StoreError> {
    let (pool, k) = (&entry.pool, &entry.keys);
    let keys = k.acquire_keys();
    let script = &shared.scripts.acquire_batch;
    let stats = &shared.stats;
    let n = u64::try_from(batch.len()).unwrap_or(u64::MAX);
    stats.calls.fetch_add(1, Ordering::Relaxed);
    stats.requests.fetch_add(n, Ordering::Relaxed);
    stats.largest.fetch_max(n, Ordering::Relaxed);
    let mut call = invocation(script, &keys);
    batch_argv(&mut call, entry, config.outbox_max, batch);
    let reply: Value = write(shared, config.durability, &k.pool, &call).await?;
    let replies = array("acquire_batch", entry.acknowledged(reply)?)?;
    if replies.len() != batch.len() {
        return Err(StoreError::Protocol(format!(
            "acquire_batch: {} replies for {} requests",
            replies.len(),
            batch.len()
        )));
    }
    Ok(replies.into_iter().zip(batch).map(|(r, w)| acquire_result(r, pool, &w.args.new_reservation_id)).collect())
}

/// acquire_batch.lua's ARGV: the count and the outbox bound, eight per Acquire, the floor.
fn batch_argv(call: &mut impl Argv, entry: &PoolEntry, outbox_max: u64, batch: &[Waiter]) {
    call.push(batch.len()).push(outbox_max);
    for w in batch {
        let a = &w.args;
        call.push(&a.user_id).push(a.quantity).push(&a.idempotency_key).push(&a.new_reservation_id);
        call.push(a.per_user_limit).push(a.reservation_ttl_ms).push(a.expect_generation.unwrap_or(0));
        call.push(u8::from(a.allow_partial));
    }
    entry.floor_arg(call);
}

/// The same error for each caller of a failed batch.
pub(super) fn copy_err(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        StoreError::Refused(m) => StoreError::Refused(m.clone()),
        StoreError::Protocol(m) => StoreError::Protocol(m.clone()),
        StoreError::PoolMissing(m) => StoreError::PoolMissing(m.clone()),
        StoreError::Fenced(m) => StoreError::Fenced(m.clone()),
        StoreError::GenerationChanged { pool, expected, actual } => {
            StoreError::GenerationChanged { pool: pool.clone(), expected: *expected, actual: *actual }
        }
    }
}
