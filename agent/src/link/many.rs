//! Borrows and Returns that go to the center together. A call made while none of its kind
//! is in flight goes at once, alone (Borrow, Return); those made while others are in
//! flight gather ([`Gather`]) and go as one Many call of their epoch (BorrowMany,
//! ReturnMany), each line keeping its request id and its own answer or error. A line the
//! center answers with a retryable error is retried alone, under the same request id.
//! Against a center that answers the Many call UNIMPLEMENTED (an older one), every call of
//! that kind goes alone from then on.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use tokio::sync::oneshot;
use tonic::{Code, Status};
use tracing::Instrument;

use super::gather::{self, Gather};
use super::{CenterLink, MANY_REFUSED, MANY_SERVED, MANY_UNKNOWN, retryable};

/// One kind of call that gathers: its line, its single call and its Many call.
pub(super) trait Kind: Sized + Send + Sync + 'static {
    type Line: Clone + Send + Sync + 'static;
    /// The single call's answer, which each line of a Many call gets too.
    type Answer: Send + 'static;
    /// One line's result in the Many call's answer.
    type LineResult: Send + 'static;
    /// The Many call's name, for logs and errors.
    const MANY: &'static str;
    /// Lines one Many call carries at most.
    const MAX_LINES: usize;

    fn lane(link: &CenterLink) -> &Lane<Self>;
    /// The single call (with the link's retries).
    fn one<'a>(
        link: &'a CenterLink,
        line: &'a Self::Line,
        epoch: u64,
    ) -> impl Future<Output = Result<Self::Answer, Status>> + Send + 'a;
    /// The Many call (with the link's retries); its results, one per line in order.
    fn many<'a>(
        link: &'a CenterLink,
        lines: Vec<Self::Line>,
        epoch: u64,
    ) -> impl Future<Output = Result<Vec<Self::LineResult>, Status>> + Send + 'a;
    /// A line's result as the single call would have answered it.
    fn answer(result: Self::LineResult) -> Result<Self::Answer, Status>;
}

/// A call waiting for the link's next call of its kind to the center.
struct Waiting<K: Kind> {
    line: K::Line,
    epoch: u64,
    answer: oneshot::Sender<Result<K::Answer, Status>>,
    /// The caller's span: the call is sent from another task, and its `traceparent` must
    /// still name the caller's span.
    span: tracing::Span,
}

/// The calls of one kind waiting to go, and what the link knows of its Many call.
pub(super) struct Lane<K: Kind> {
    queue: Gather<Waiting<K>>,
    /// Whether the center serves the Many call: `MANY_UNKNOWN`, `MANY_SERVED` or `MANY_REFUSED`.
    many: AtomicU8,
    /// Many calls answered so far.
    many_calls: AtomicU64,
    /// Single calls answered so far.
    calls: AtomicU64,
}

impl<K: Kind> Default for Lane<K> {
    fn default() -> Self {
        Self {
            queue: Gather::default(),
            many: AtomicU8::new(MANY_UNKNOWN),
            many_calls: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }
}

impl<K: Kind> Lane<K> {
    pub(super) fn many_calls(&self) -> u64 {
        self.many_calls.load(Ordering::Relaxed)
    }

    pub(super) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn refused(&self) -> bool {
        self.many.load(Ordering::Acquire) == MANY_REFUSED
    }
}

impl CenterLink {
    /// A call of kind `K` under `epoch`, alone or with others (see the module's note).
    pub(super) async fn gathered<K: Kind>(self: &Arc<Self>, line: K::Line, epoch: u64) -> Result<K::Answer, Status> {
        let lane = K::lane(self);
        if lane.refused() {
            return self.alone::<K>(&line, epoch).await;
        }
        let (tx, rx) = oneshot::channel();
        if lane.queue.push(Waiting { line, epoch, answer: tx, span: tracing::Span::current() }) {
            let me = Arc::clone(self);
            tokio::spawn(async move { me.send_gathered::<K>().await });
        }
        rx.await.unwrap_or_else(|_| Err(Status::unavailable("agent stopping")))
    }

    /// The single call, counted.
    async fn alone<K: Kind>(&self, line: &K::Line, epoch: u64) -> Result<K::Answer, Status> {
        K::one(self, line, epoch).await.inspect(|_| {
            K::lane(self).calls.fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Sends what waits, one call at a time, until nothing does.
    async fn send_gathered<K: Kind>(self: Arc<Self>) {
        let pick = |waiting: &mut Vec<Waiting<K>>| gather::one_epoch(waiting, K::MAX_LINES, |w| w.epoch);
        K::lane(&self)
            .queue
            .drain(pick, |batch| async {
                if batch.len() == 1 || K::lane(&self).refused() {
                    futures::future::join_all(batch.into_iter().map(|w| self.answer_alone(w))).await;
                } else {
                    self.send_many(batch).await;
                }
            })
            .await;
    }

    async fn answer_alone<K: Kind>(&self, w: Waiting<K>) {
        let answer = self.alone::<K>(&w.line, w.epoch).instrument(w.span.clone()).await;
        let _ = w.answer.send(answer);
    }

    async fn send_many<K: Kind>(&self, batch: Vec<Waiting<K>>) {
        let lane = K::lane(self);
        let lines: Vec<K::Line> = batch.iter().map(|w| w.line.clone()).collect();
        // The center's span joins the first line's trace (one call, one parent).
        let result = K::many(self, lines, batch[0].epoch).instrument(batch[0].span.clone()).await;
        let results = match result {
            Ok(r) if r.len() == batch.len() => {
                lane.many.store(MANY_SERVED, Ordering::Release);
                lane.many_calls.fetch_add(1, Ordering::Relaxed);
                r
            }
            Ok(r) => {
                let s = Status::internal(format!("{}: {} answers to {} lines", K::MANY, r.len(), batch.len()));
                for w in batch {
                    let _ = w.answer.send(Err(s.clone()));
                }
                return;
            }
            Err(s) if s.code() == Code::Unimplemented => {
                tracing::info!(center = %self.url, call = K::MANY, "the center does not serve it; one item at a time");
                lane.many.store(MANY_REFUSED, Ordering::Release);
                futures::future::join_all(batch.into_iter().map(|w| self.answer_alone(w))).await;
                return;
            }
            Err(s) => {
                for w in batch {
                    let _ = w.answer.send(Err(s.clone()));
                }
                return;
            }
        };
        let mut again = Vec::new();
        for (w, r) in batch.into_iter().zip(results) {
            match K::answer(r) {
                // The line's request id is unchanged: alone, it is retried like any call.
                Err(s) if retryable(s.code()) => again.push(w),
                answer => {
                    let _ = w.answer.send(answer);
                }
            }
        }
        futures::future::join_all(again.into_iter().map(|w| self.answer_alone(w))).await;
    }
}
