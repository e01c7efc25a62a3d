//! Reporting: the pools as heartbeats carry them. A lost pool is reported lost (so the
//! center puts what the channel holds in doubt), never as an empty one; a heartbeat
//! carries only the pools whose report changed since the center acknowledged one.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use inventory_core::channel::{Report, full_reads_per_heartbeat};
use inventory_proto::v1 as pb;
use tonic::Status;

use crate::items::{Item, Items, view};
use crate::link::CenterLink;
use crate::store::PoolStore;

/// Items whose pools one store call reads when reading every pool (the Redis store reads
/// them in one script call on one server), and such calls in flight at once.
const ITEMS_PER_READ: usize = 100;
const READS_IN_FLIGHT: usize = 8;

/// Pools one Heartbeat carries at most: a full report of a large catalogue (a registration's,
/// a drain's) goes in several calls, each well within the center's request deadline.
pub const MAX_POOLS_PER_CALL: usize = 5_000;

/// The calls of a report of `len` pools, at most `max` each: each call's range of the
/// reports and whether it carries `last_report` (only the last one may). A report of no
/// pools is one call (it still renews the lease).
pub fn parts(len: usize, max: usize, last_report: bool) -> Vec<(Range<usize>, bool)> {
    let max = max.max(1);
    let calls = len.div_ceil(max).max(1);
    (0..calls).map(|k| (k * max..((k + 1) * max).min(len), last_report && k + 1 == calls)).collect()
}

pub struct Reporting {
    store: Arc<dyn PoolStore>,
    link: Arc<CenterLink>,
    items: Arc<Items>,
    /// Pools per Heartbeat call ([`MAX_POOLS_PER_CALL`]).
    max_pools: AtomicUsize,
    /// Where the next quiet heartbeat's share of whole reads starts, in item id order.
    turn: AtomicUsize,
}

/// One pool's report as read for a heartbeat: with its sell rate then (units/s × 1000)
/// and its segments' floors.
type Read = (Arc<Item>, Report, u64, Vec<u64>);

/// `floors[s]`: segment s's floor in the store layer when the report was read (its write
/// sequence as the agent saw its own writes acknowledged), which the center remembers.
fn report_pb(item: &Item, r: &Report, sell_rate_milli: u64, floors: &[u64]) -> pb::PoolReport {
    let item_id = &item.item_id;
    let floor = |s: u32| floors.get(s as usize).copied().unwrap_or(0);
    let write_seq = if item.is_segmented() { 0 } else { floor(0) };
    match r {
        Report::Lost => pb::PoolReport { item_id: item_id.to_owned(), lost: true, write_seq, ..Default::default() },
        Report::Counts(v) => pb::PoolReport {
            // The counts are then the intact segments' (`segmented::snapshot`).
            lost_segments: if item.is_segmented() { item.lost_segments() } else { Vec::new() },
            segments: if item.is_segmented() {
                item.segment_counts()
                    .into_iter()
                    .map(|g| pb::SegmentCounts {
                        segment: g.segment,
                        available: g.counts.available,
                        reserved: g.counts.reserved,
                        sold: g.counts.sold,
                        lost: g.lost,
                        write_seq: floor(g.segment),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            item_id: item_id.to_owned(),
            available: v.available,
            reserved: v.reserved,
            sold: v.sold,
            generation: v.generation,
            lost: false,
            sell_rate_milli,
            write_seq,
        },
    }
}

/// Reports read for one heartbeat.
/// Each with the pool's sell rate when it was read (units/s × 1000), and its segments'
/// floors then.
pub struct Reports(Vec<Read>);

impl Reports {
    pub fn to_pb(&self) -> Vec<pb::PoolReport> {
        self.0.iter().map(|(item, r, rate, floors)| report_pb(item, r, *rate, floors)).collect()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The parts of one report sent so far: whether any was answered, and the last answer
/// (the first failure stops the rest).
struct Sent {
    answered: bool,
    result: Result<pb::HeartbeatResponse, Status>,
}

impl Default for Sent {
    fn default() -> Self {
        Self { answered: false, result: Err(Status::internal("no heartbeat sent")) }
    }
}

impl Sent {
    /// Notes one part's answer; false when the rest must not be sent.
    fn note(&mut self, answer: Result<pb::HeartbeatResponse, Status>) -> bool {
        self.answered |= answer.is_ok();
        self.result = answer;
        self.result.is_ok()
    }
}

impl Reporting {
    pub fn new(store: Arc<dyn PoolStore>, link: Arc<CenterLink>, items: Arc<Items>) -> Self {
        Self { store, link, items, max_pools: AtomicUsize::new(MAX_POOLS_PER_CALL), turn: AtomicUsize::new(0) }
    }

    /// Every pool's report. Pools are read a hundred items to a store call, several calls
    /// in flight: with thousands of items a report costs a few rounds of reads.
    pub async fn all(&self) -> Reports {
        Reports(self.read_whole(self.items.all()).await)
    }

    async fn read_whole(&self, items: Vec<Arc<Item>>) -> Vec<Read> {
        let chunks: Vec<Vec<Arc<Item>>> = items.chunks(ITEMS_PER_READ).map(<[_]>::to_vec).collect();
        let read: Vec<Vec<_>> = futures::stream::iter(chunks)
            .map(|chunk| self.read_chunk(chunk))
            .buffer_unordered(READS_IN_FLIGHT)
            .collect()
            .await;
        read.into_iter().flatten().collect()
    }

    /// The periodic heartbeat's reports, those that changed since the center last
    /// acknowledged one, read quietly (`inventory_core::channel::quiet`): each pool's stamp
    /// first, and a whole read only of the pools whose stamp moved or whose last whole read
    /// is past the bound, of those the stamps cannot vouch for (segmented, lost), and of a
    /// share in turn (so every pool comes round well within the bound, a few at a time).
    /// `period`: how often the heartbeat runs.
    pub async fn quiet(&self, period: Duration) -> Reports {
        let mut items = self.items.all();
        items.sort_unstable_by(|a, b| a.item_id.cmp(&b.item_id));
        let n = items.len();
        let period_ms = i64::try_from(period.as_millis()).unwrap_or(i64::MAX);
        let share = full_reads_per_heartbeat(n, period_ms, self.items.settings().full_read_every_ms);
        let start = self.turn.fetch_add(share, Ordering::Relaxed) % n.max(1);
        let in_turn = |i: usize| (i + n - start) % n < share;
        let (mut whole, mut stamped) = (Vec::new(), Vec::new());
        for (i, item) in items.into_iter().enumerate() {
            if in_turn(i) || item.is_segmented() || !item.with(|c| c.report_needs_read()) {
                whole.push(item);
            } else {
                stamped.push(item);
            }
        }
        let chunks: Vec<Vec<Arc<Item>>> = stamped.chunks(ITEMS_PER_READ).map(<[_]>::to_vec).collect();
        let stamped: Vec<(Vec<Read>, Vec<Arc<Item>>)> = futures::stream::iter(chunks)
            .map(|chunk| self.stamp_chunk(chunk))
            .buffer_unordered(READS_IN_FLIGHT)
            .collect()
            .await;
        let mut reads = Vec::with_capacity(n);
        for (vouched, moved) in stamped {
            reads.extend(vouched);
            whole.extend(moved);
        }
        reads.extend(self.read_whole(whole).await);
        Reports(reads.into_iter().filter(|(item, r, rate, _)| item.with(|c| c.report_changed(r, *rate))).collect())
    }

    /// The reports of `chunk`'s pools whose stamp vouches for their last whole read, and
    /// the items to read whole (their stamp moved, or could not be read).
    async fn stamp_chunk(&self, chunk: Vec<Arc<Item>>) -> (Vec<Read>, Vec<Arc<Item>>) {
        let tokens: Vec<_> = chunk.iter().map(|item| item.with(|c| c.begin_read())).collect();
        let pools: Vec<_> = chunk.iter().map(|item| item.pool.clone()).collect();
        let stamps = self.store.stamps(&pools).await;
        let ctx = inventory_core::channel::Ctx { now_ms: crate::clock::now_ms(), epoch: self.link.epoch() };
        let (mut vouched, mut moved) = (Vec::new(), Vec::new());
        for ((item, token), stamp) in chunk.into_iter().zip(tokens).zip(stamps) {
            let report = stamp.ok().and_then(|stamp| {
                item.with(|c| {
                    let report = c.report_unchanged(stamp, token, ctx)?;
                    Some((report, c.sell_rate_milli(ctx.now_ms)))
                })
            });
            match report {
                Some((report, rate)) => {
                    let floors = item.pools.iter().map(|p| self.store.floor(p)).collect();
                    vouched.push((item, report, rate, floors));
                }
                None => moved.push(item),
            }
        }
        (vouched, moved)
    }

    /// The reports of `chunk`'s items: the unsegmented pools in one store call, each
    /// segmented item as its segments read together ([`crate::segmented::snapshot`]). An
    /// item whose read failed is left out (reported next time).
    async fn read_chunk(&self, chunk: Vec<Arc<Item>>) -> Vec<Read> {
        let store = self.store.as_ref();
        let epoch = self.link.epoch();
        // Each item's token is taken before its read, so a change made while the read is
        // in flight is not taken for the read's (`ItemCore::report`).
        let tokens: Vec<_> = chunk.iter().map(|item| item.with(|c| (c.report_needs_read(), c.begin_read()))).collect();
        let reads =
            |segmented: bool| chunk.iter().zip(&tokens).filter(move |(i, (r, _))| *r && i.is_segmented() == segmented);
        let plain: Vec<_> = reads(false).map(|(item, _)| item.pool.clone()).collect();
        let (plain, segmented) = futures::join!(
            store.snapshots(&plain),
            futures::future::join_all(reads(true).map(|(item, _)| crate::segmented::snapshot(store, item, epoch)))
        );
        let (mut plain, mut segmented) = (plain.into_iter(), segmented.into_iter());
        let mut out = Vec::with_capacity(chunk.len());
        for (item, (needs_read, token)) in chunk.into_iter().zip(tokens) {
            // With the pool's write sequence (an unsegmented pool's own: a segmented item's
            // reports are never vouched for by stamps).
            let snap = match (needs_read, item.is_segmented()) {
                (false, _) => None,
                (true, false) => plain.next().and_then(Result::ok).map(|s| (crate::segmented::sum(&[s]), s.write_seq)),
                (true, true) => segmented.next().and_then(Result::ok).map(|s| (s, 0)),
            };
            if needs_read && snap.is_none() {
                continue;
            }
            let mut notes = Vec::new();
            let ctx = inventory_core::channel::Ctx { now_ms: crate::clock::now_ms(), epoch: self.link.epoch() };
            let Some((report, rate)) = item.with(|c| {
                let report = c.report_read(snap.as_ref().map(|(s, seq)| (view(s), *seq)), token, ctx, &mut notes)?;
                // A lost pool sells nothing: its rate is not reported.
                let rate = if report == Report::Lost { 0 } else { c.sell_rate_milli(ctx.now_ms) };
                Some((report, rate))
            }) else {
                continue;
            };
            for n in notes {
                tracing::error!(item = %item.item_id, note = ?n, "pool lost its data in the store; frozen, its units in doubt");
            }
            let floors = item.pools.iter().map(|p| self.store.floor(p)).collect();
            out.push((item, report, rate, floors));
        }
        out
    }

    /// Only the pools whose report changed since the center last acknowledged one.
    pub async fn changed(&self) -> Reports {
        let Reports(all) = self.all().await;
        Reports(all.into_iter().filter(|(item, r, rate, _)| item.with(|c| c.report_changed(r, *rate))).collect())
    }

    /// Pools one Heartbeat carries at most from now on (a test hook; [`MAX_POOLS_PER_CALL`]
    /// otherwise).
    pub fn set_max_pools_per_call(&self, n: usize) {
        self.max_pools.store(n.max(1), Ordering::Relaxed);
    }

    /// Heartbeats carrying `reports`: renew the lease, record the reports the center
    /// acknowledged, and stop selling the items it holds in doubt. Past
    /// [`MAX_POOLS_PER_CALL`] pools the reports go in several calls, one after another
    /// ([`parts`]): each renews the lease and records its own pools; only the last carries
    /// `last_report`, and it is sent only once every other part was answered, so the center
    /// takes it as the agent's last word only when every part landed. The first failure
    /// stops the rest.
    pub async fn send(&self, reports: Reports, last_report: bool) -> Result<pb::HeartbeatResponse, Status> {
        let max = self.max_pools.load(Ordering::Relaxed);
        let mut rest = reports.0;
        let mut sent = Sent::default();
        for (range, last) in parts(rest.len(), max, last_report) {
            let tail = rest.split_off(range.len());
            let part = Reports(std::mem::replace(&mut rest, tail));
            if !sent.note(self.send_part(part, last).await) {
                break;
            }
        }
        self.conclude(sent)
    }

    /// Every pool's report ([`Reporting::all`]) sent as [`Reporting::send`] sends it, but
    /// read a call's worth at a time, each part read while the one before it is sent: a
    /// registration's or a drain's report of a large catalogue takes about the longer of
    /// the reads and the calls, not their sum. Only the last part carries `last_report`,
    /// sent once every other part was answered.
    pub async fn send_all(&self, last_report: bool) -> Result<pb::HeartbeatResponse, Status> {
        let max = self.max_pools.load(Ordering::Relaxed);
        let items = self.items.all();
        let calls = parts(items.len(), max, last_report);
        let read = |k: usize| calls.get(k).map(|(range, _)| self.read_whole(items[range.clone()].to_vec()));
        let mut sent = Sent::default();
        let mut part = match read(0) {
            Some(first) => first.await,
            None => Vec::new(),
        };
        for (k, (_, last)) in calls.iter().enumerate() {
            let next = async {
                match read(k + 1) {
                    Some(reading) => reading.await,
                    None => Vec::new(),
                }
            };
            let (answer, next) = futures::join!(self.send_part(Reports(part), *last), next);
            if !sent.note(answer) {
                break;
            }
            part = next;
        }
        self.conclude(sent)
    }

    /// After the parts of a report were sent: the items learn that the center answered,
    /// and which of them it no longer holds in doubt.
    fn conclude(&self, sent: Sent) -> Result<pb::HeartbeatResponse, Status> {
        if sent.answered {
            let now = crate::clock::now_ms();
            for item in self.items.all() {
                item.with(|c| c.on_center_answered(now));
            }
        }
        // Every answer lists all the channel's items in doubt: the last one says which
        // frozen items the center no longer holds in doubt (reported again next time).
        if let Ok(answer) = &sent.result {
            let in_doubt: std::collections::HashSet<&str> = answer.in_doubt_items.iter().map(String::as_str).collect();
            for item in self.items.all().into_iter().filter(|i| !in_doubt.contains(i.item_id.as_str())) {
                item.with(|c| c.on_not_in_doubt());
            }
        }
        sent.result
    }

    async fn send_part(&self, reports: Reports, last_report: bool) -> Result<pb::HeartbeatResponse, Status> {
        let answer = self.link.heartbeat(reports.to_pb(), last_report).await?;
        for (item, r, rate, _) in reports.0 {
            item.with(|c| c.reported(r, rate));
        }
        for id in &answer.in_doubt_items {
            if let Some(item) = self.items.get(id)
                && item.with(|c| c.on_in_doubt())
            {
                tracing::error!(item = %id, "center holds units of the item in doubt; not selling it");
            }
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::parts;

    #[test]
    fn a_report_within_one_call_goes_whole() {
        assert_eq!(parts(0, 5, true), vec![(0..0, true)]);
        assert_eq!(parts(5, 5, false), vec![(0..5, false)]);
    }

    #[test]
    fn a_large_report_goes_in_parts_and_only_the_last_is_the_last_word() {
        assert_eq!(parts(11, 5, true), vec![(0..5, false), (5..10, false), (10..11, true)]);
        assert_eq!(parts(10, 5, false), vec![(0..5, false), (5..10, false)]);
        let covered: usize = parts(100_000, 5_000, true).iter().map(|(r, _)| r.len()).sum();
        assert_eq!(covered, 100_000);
    }
}
