//! Item loads (DescribeItem on the agent's first use of an item) made while others are in
//! flight go to the center together, as one DescribeItems of up to 500 items: an agent
//! starting on 10,000 items asks a few dozen times, not 10,000. A load alone goes at once,
//! as a DescribeItem, so one buyer's first Acquire waits no longer than before. Against a
//! center that answers DescribeItems UNIMPLEMENTED (an older one), each load goes alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use inventory_proto::v1 as pb;
use tokio::sync::oneshot;
use tonic::{Code, Status};

use super::CenterLink;
use super::gather::Gather;

type Answer = Result<pb::DescribeItemResponse, Status>;

/// Most items one DescribeItems names (the center's bound).
const MAX_ITEMS: usize = 500;
#[derive(Default)]
pub(super) struct Describes {
    queue: Gather<(String, oneshot::Sender<Answer>)>,
    /// The center answered DescribeItems UNIMPLEMENTED.
    refused: AtomicBool,
    /// DescribeItems calls answered so far.
    many_calls: AtomicU64,
}

impl CenterLink {
    /// DescribeItem of `item_id` for loading it, sent with the other loads waiting.
    pub async fn describe_to_load(self: &Arc<Self>, item_id: &str) -> Answer {
        if self.describes.refused.load(Ordering::Relaxed) {
            return self.describe(item_id).await;
        }
        let (tx, rx) = oneshot::channel();
        if self.describes.queue.push((item_id.to_owned(), tx)) {
            let link = Arc::clone(self);
            tokio::spawn(async move { link.send_describes().await });
        }
        rx.await.unwrap_or_else(|_| Err(Status::unavailable(format!("the load of item {item_id} was dropped; retry"))))
    }

    /// DescribeItems calls answered so far (each for several items).
    pub fn describe_many_calls(&self) -> u64 {
        self.describes.many_calls.load(Ordering::Relaxed)
    }

    /// Sends what waits, a call at a time, until nothing does.
    async fn send_describes(self: Arc<Self>) {
        let pick = |waiting: &mut Vec<_>| {
            let n = waiting.len().min(MAX_ITEMS);
            waiting.drain(..n).collect()
        };
        self.describes.queue.drain(pick, |batch| self.describe_batch(batch)).await;
    }

    async fn describe_batch(&self, batch: Vec<(String, oneshot::Sender<Answer>)>) {
        if batch.len() == 1 || self.describes.refused.load(Ordering::Relaxed) {
            return self.describe_each(batch).await;
        }
        let req = pb::DescribeItemsRequest {
            channel: self.channel.to_string(),
            item_ids: batch.iter().map(|(id, _)| id.clone()).collect(),
        };
        let wall_sent = self.wall_ms();
        let r = self.client.clone().describe_items(self.req(req)).await.map(|r| r.into_inner());
        self.note_credentials(&r);
        match r {
            Ok(answer) => {
                if let Some(first) = answer.items.first() {
                    self.observe_clock(wall_sent, first.center_now_unix_ms);
                }
                self.describes.many_calls.fetch_add(1, Ordering::Relaxed);
                let found: HashMap<String, pb::DescribeItemResponse> =
                    answer.items.into_iter().map(|d| (d.item_id.clone(), d)).collect();
                for (id, tx) in batch {
                    // An id asked twice (two loads of one item) gets its answer twice.
                    let d = found.get(&id).cloned();
                    let _ = tx.send(d.ok_or_else(|| Status::not_found(format!("item {id} not found"))));
                }
            }
            Err(s) if s.code() == Code::Unimplemented => {
                tracing::info!("the center does not serve DescribeItems; loading items one at a time");
                self.describes.refused.store(true, Ordering::Relaxed);
                self.describe_each(batch).await;
            }
            Err(s) => {
                for (_, tx) in batch {
                    let _ = tx.send(Err(s.clone()));
                }
            }
        }
    }

    async fn describe_each(&self, batch: Vec<(String, oneshot::Sender<Answer>)>) {
        futures::future::join_all(batch.into_iter().map(|(id, tx)| async move {
            let _ = tx.send(self.describe(&id).await);
        }))
        .await;
    }
}
