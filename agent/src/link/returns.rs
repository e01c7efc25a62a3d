//! Returns made while other calls are in flight go to the center together, as one
//! ReturnMany of their epoch (up to 500 lines), each line keeping its request id and its
//! own answer or error: a drain giving back many pools at once sends a call per few dozen
//! pools, not one per pool. A Return alone goes at once, as a Return. Against a center
//! that answers ReturnMany UNIMPLEMENTED (an older one), every Return goes alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use inventory_core::ledger::MAX_RETURN_LINES;
use inventory_proto::v1 as pb;
use tokio::sync::oneshot;
use tonic::{Code, Status};
use tracing::Instrument;

use super::gather::{self, Gather};
use super::{CenterLink, MANY_REFUSED, MANY_SERVED, MANY_UNKNOWN, retryable, with_traceparent};

type Answer = Result<pb::ReturnResponse, Status>;

/// A Return waiting for the link's next call to the center.
struct Waiting {
    line: pb::ReturnLine,
    epoch: u64,
    answer: oneshot::Sender<Answer>,
    /// The caller's span (the call is sent from another task).
    span: tracing::Span,
}

pub(super) struct Returns {
    queue: Gather<Waiting>,
    /// Whether the center serves ReturnMany: `MANY_UNKNOWN`, `MANY_SERVED` or `MANY_REFUSED`.
    many: AtomicU8,
    /// ReturnMany calls answered so far.
    many_calls: AtomicU64,
    /// Return calls (one item each) answered so far.
    calls: AtomicU64,
}

impl Default for Returns {
    fn default() -> Self {
        Self {
            queue: Gather::default(),
            many: AtomicU8::new(MANY_UNKNOWN),
            many_calls: AtomicU64::new(0),
            calls: AtomicU64::new(0),
        }
    }
}

impl CenterLink {
    /// A Return under `epoch`: the epoch under which its units were taken out of the pool.
    /// Sent under a later epoch, it could be accepted after another incarnation's resync
    /// already counted those units back into the pool. `write_seq_floors`: the pool's
    /// segments' floors once the take was acknowledged, which the center keeps.
    ///
    /// Returns made while other calls are in flight gather as Borrows do
    /// ([`CenterLink::borrow`]) and go as one ReturnMany of their epoch.
    pub async fn give_back(
        self: &Arc<Self>,
        item_id: &str,
        quantity: u64,
        request_id: &str,
        epoch: u64,
        write_seq_floors: &[u64],
    ) -> Answer {
        if self.returns.many.load(Ordering::Acquire) == MANY_REFUSED {
            return self.give_back_one(item_id, quantity, request_id, epoch, write_seq_floors).await;
        }
        let (tx, rx) = oneshot::channel();
        let line = pb::ReturnLine {
            item_id: item_id.to_owned(),
            quantity,
            request_id: request_id.to_owned(),
            write_seq_floors: write_seq_floors.to_vec(),
        };
        if self.returns.queue.push(Waiting { line, epoch, answer: tx, span: tracing::Span::current() }) {
            let me = Arc::clone(self);
            tokio::spawn(async move { me.send_returns().await });
        }
        rx.await.unwrap_or_else(|_| Err(Status::unavailable("agent stopping")))
    }

    /// ReturnMany calls the center answered.
    pub fn return_many_calls(&self) -> u64 {
        self.returns.many_calls.load(Ordering::Relaxed)
    }

    /// Return calls (one item each) the center answered.
    pub fn return_calls(&self) -> u64 {
        self.returns.calls.load(Ordering::Relaxed)
    }

    /// Sends what waits, one call at a time, until nothing does.
    async fn send_returns(self: Arc<Self>) {
        let pick = |waiting: &mut Vec<Waiting>| gather::one_epoch(waiting, MAX_RETURN_LINES, |w| w.epoch);
        self.returns
            .queue
            .drain(pick, |batch| async {
                if batch.len() == 1 || self.returns.many.load(Ordering::Acquire) == MANY_REFUSED {
                    futures::future::join_all(batch.into_iter().map(|w| self.return_alone(w))).await;
                } else {
                    self.send_return_many(batch).await;
                }
            })
            .await;
    }

    async fn return_alone(&self, w: Waiting) {
        let l = &w.line;
        let answer = self
            .give_back_one(&l.item_id, l.quantity, &l.request_id, w.epoch, &l.write_seq_floors)
            .instrument(w.span.clone())
            .await;
        let _ = w.answer.send(answer);
    }

    async fn send_return_many(&self, batch: Vec<Waiting>) {
        let epoch = batch[0].epoch;
        let lines: Vec<pb::ReturnLine> = batch.iter().map(|w| w.line.clone()).collect();
        // The center's span joins the first line's trace (one call, one parent).
        let result = self
            .retry(epoch, |mut c, epoch| {
                let mut req =
                    self.req(pb::ReturnManyRequest { channel: self.channel.to_string(), epoch, lines: lines.clone() });
                with_traceparent(&mut req, &lines[0].request_id);
                async move { c.return_many(req).await.map(|r| r.into_inner()) }
            })
            .instrument(batch[0].span.clone())
            .await;
        let results = match result {
            Ok(r) if r.results.len() == batch.len() => {
                self.returns.many.store(MANY_SERVED, Ordering::Release);
                self.returns.many_calls.fetch_add(1, Ordering::Relaxed);
                r.results
            }
            Ok(r) => {
                let s = Status::internal(format!("return many: {} answers to {} lines", r.results.len(), batch.len()));
                for w in batch {
                    let _ = w.answer.send(Err(s.clone()));
                }
                return;
            }
            Err(s) if s.code() == Code::Unimplemented => {
                tracing::info!(center = %self.url, "the center does not serve ReturnMany; returning one item at a time");
                self.returns.many.store(MANY_REFUSED, Ordering::Release);
                futures::future::join_all(batch.into_iter().map(|w| self.return_alone(w))).await;
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
            let code = Code::from_i32(r.code);
            if code == Code::Ok {
                let _ = w
                    .answer
                    .send(Ok(pb::ReturnResponse { center_available: r.center_available, replayed: r.replayed }));
            } else if retryable(code) {
                // The line's request id is unchanged: alone, it is retried like any Return.
                again.push(w);
            } else {
                let _ = w.answer.send(Err(Status::new(code, r.message)));
            }
        }
        futures::future::join_all(again.into_iter().map(|w| self.return_alone(w))).await;
    }

    async fn give_back_one(
        &self,
        item_id: &str,
        quantity: u64,
        request_id: &str,
        epoch: u64,
        write_seq_floors: &[u64],
    ) -> Answer {
        self.retry(epoch, |mut c, epoch| {
            let req = pb::ReturnRequest {
                item_id: item_id.to_owned(),
                channel: self.channel.to_string(),
                epoch,
                quantity,
                request_id: request_id.to_owned(),
                write_seq_floors: write_seq_floors.to_vec(),
            };
            let mut req = self.req(req);
            with_traceparent(&mut req, request_id);
            async move { c.r#return(req).await.map(|r| r.into_inner()) }
        })
        .await
        .inspect(|_| {
            self.returns.calls.fetch_add(1, Ordering::Relaxed);
        })
    }
}
