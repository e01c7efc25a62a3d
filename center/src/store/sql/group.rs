//! Group commit: concurrent Borrows and Returns of one item join one transaction.
//!
//! A call queues under its item. When no batch of the item is running, the call starts
//! one: a task that takes what is queued (at most [`MAX_GROUP`] lines), runs it as one
//! transaction and answers each line, and goes on while calls queued during the previous
//! transaction; one call alone goes straight through as a batch of one. Each line keeps
//! its own answer, replay and error (`store::batch`); a batch that fails as a whole is
//! retried line by line, so each line gets the error it would have got alone.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::oneshot;

use super::SqlLedger;
use crate::error::CenterError;
use crate::store::Result;
use crate::store::batch::{Answer, Op};

/// Lines per transaction.
const MAX_GROUP: usize = 256;

type Waiting = (Op, oneshot::Sender<Result<Answer>>);

/// Queued lines by item; an item is present while a batch of it runs.
#[derive(Default)]
pub(super) struct Groups {
    queues: Mutex<HashMap<String, Vec<Waiting>>>,
    /// Batches run and the calls they answered, since start.
    batches: AtomicU64,
    calls: AtomicU64,
}

impl SqlLedger {
    /// `(batches, calls)`: the group-commit batches run since start and the Borrow and
    /// Return calls they carried.
    pub(super) fn group_commits(&self) -> (u64, u64) {
        (self.groups.batches.load(Ordering::Relaxed), self.groups.calls.load(Ordering::Relaxed))
    }

    /// Runs `op` in the next transaction of its item.
    pub(super) async fn submit(&self, op: Op) -> Result<Answer> {
        let (tx, rx) = oneshot::channel();
        let item = op.item.as_str().to_owned();
        let start = {
            let mut queues = self.groups.queues.lock().unwrap_or_else(|e| e.into_inner());
            match queues.get_mut(&item) {
                Some(waiting) => {
                    waiting.push((op, tx));
                    false
                }
                None => {
                    queues.insert(item.clone(), vec![(op, tx)]);
                    true
                }
            }
        };
        if start {
            // A task of its own: a caller that gives up does not cancel the others' batch.
            let me = self.clone();
            tokio::spawn(async move { me.drain(item).await });
        }
        rx.await
            .unwrap_or_else(|_| Err(CenterError::Unavailable("center stopping, retry with the same request id".into())))
    }

    async fn drain(self, item: String) {
        loop {
            let batch: Vec<Waiting> = {
                let mut queues = self.groups.queues.lock().unwrap_or_else(|e| e.into_inner());
                let Some(waiting) = queues.get_mut(&item) else { return };
                if waiting.is_empty() {
                    queues.remove(&item);
                    return;
                }
                let n = waiting.len().min(MAX_GROUP);
                waiting.drain(..n).collect()
            };
            let (ops, senders): (Vec<Op>, Vec<_>) = batch.into_iter().unzip();
            self.groups.batches.fetch_add(1, Ordering::Relaxed);
            self.groups.calls.fetch_add(ops.len() as u64, Ordering::Relaxed);
            match self.run_batch(&ops).await {
                Ok((answers, _)) => {
                    for (answer, tx) in answers.into_iter().zip(senders) {
                        let _ = tx.send(answer);
                    }
                }
                Err(e) if ops.len() == 1 => {
                    let _ = senders.into_iter().next().map(|tx| tx.send(Err(e)));
                }
                Err(_) => {
                    for (op, tx) in ops.into_iter().zip(senders) {
                        let answer = match self.run_batch(std::slice::from_ref(&op)).await {
                            Ok((mut answers, _)) => {
                                answers.pop().unwrap_or_else(|| Err(CenterError::Internal("no answer".into())))
                            }
                            Err(e) => Err(e),
                        };
                        let _ = tx.send(answer);
                    }
                }
            }
        }
    }
}
