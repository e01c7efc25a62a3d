//! The pools' outboxes as the wire sees them: [`event_pb`] turns a pool's
//! [`PoolEvent`] into a [`pb::ReservationEvent`] (the broker relay sends the same
//! message), and [`EventFeed`] serves `StreamEvents`: each pool's kept events from a
//! sequence on, then new ones as they are written.
//!
//! A stream reads only (it works on followers too). It wakes when this agent's selling path
//! changed a reservation ([`EventFeed::written`]) and then reads only the pools written
//! since it last looked; it polls every pool as a backstop (transitions by other replicas
//! sharing the store, or by the sweeper), at most [`BACKSTOP_READS_PER_SEC`] pool reads a
//! second, so a stream of every item costs the store a bounded rate however many items
//! there are. Each stream is one task feeding a bounded channel: a slow client holds its
//! task, never the store. Streams end when the client goes away or the agent stops
//! ([`EventFeed::stop`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use inventory_proto::v1 as pb;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::task::TaskTracker;

use crate::items::{Item, Items};
use crate::store::{PoolEvent, PoolKey, PoolStore};
use crate::wire::reservation_state_pb;

/// Events read from one pool per store call.
const PAGE: u64 = 256;

/// How often a stream looks for events nobody told it about...
const POLL: Duration = Duration::from_millis(200);

/// ...but with many pools, at most this many backstop reads a second per stream (10,000
/// items: each pool every 5 s).
pub const BACKSTOP_READS_PER_SEC: u64 = 2_000;

/// Events buffered per stream before the reader waits for the client.
const STREAM_BUFFER: usize = 512;

/// `<channel>:<item_id>:<segment>:<pool generation>:<sequence>`: unique over the pool's
/// lifetime and its re-creations; the broker's deduplication id.
pub fn event_id(pool: &PoolKey, generation: u64, sequence: u64) -> String {
    format!("{}:{}:{}:{generation}:{sequence}", pool.channel, pool.item_id, pool.segment)
}

/// One outbox event of `pool` (of generation `generation`) as the wire carries it.
pub fn event_pb(pool: &PoolKey, generation: u64, e: &PoolEvent) -> pb::ReservationEvent {
    pb::ReservationEvent {
        event_id: event_id(pool, generation, e.sequence),
        channel: pool.channel.clone(),
        item_id: pool.item_id.clone(),
        segment: pool.segment,
        sequence: e.sequence,
        reservation_id: e.reservation_id.clone(),
        idempotency_key: e.idempotency_key.clone(),
        user_id: e.user_id.clone(),
        quantity: e.quantity,
        state: reservation_state_pb(e.state),
        previous_state: e.previous.map_or(pb::ReservationState::Unspecified as i32, reservation_state_pb),
        at_unix_ms: e.at_ms,
        pool_generation: generation,
    }
}

/// Serves the event streams of one agent.
pub struct EventFeed {
    store: Arc<dyn PoolStore>,
    items: Arc<Items>,
    written: Notify,
    /// Transitions this agent wrote, per item: a woken stream reads the pools whose count moved.
    writes: DashMap<String, u64>,
    stop: watch::Sender<bool>,
    tasks: TaskTracker,
}

/// Where one stream stands in one pool.
struct Cursor {
    generation: u64,
    next: u64,
    /// [`EventFeed::written`]'s count of the pool when it was last read.
    writes: u64,
}

impl EventFeed {
    pub fn new(store: Arc<dyn PoolStore>, items: Arc<Items>) -> Self {
        Self {
            store,
            items,
            written: Notify::new(),
            writes: DashMap::new(),
            stop: watch::channel(false).0,
            tasks: TaskTracker::new(),
        }
    }

    /// A reservation of `pool` changed in this agent: wake the streams.
    pub fn written(&self, pool: &PoolKey) {
        // The item's counter exists after its first write: no key allocated on the hot path.
        match self.writes.get_mut(pool.item_id.as_str()) {
            Some(mut n) => *n += 1,
            None => *self.writes.entry(pool.item_id.clone()).or_default() += 1,
        }
        self.written.notify_waiters();
    }

    fn writes(&self, item_id: &str) -> u64 {
        self.writes.get(item_id).map_or(0, |n| *n)
    }

    /// Ends every stream (their clients see the stream end) and refuses new ones.
    pub fn stop(&self) {
        self.stop.send_replace(true);
        self.tasks.close();
    }

    /// Waits until every stream task has ended (after [`EventFeed::stop`]).
    pub async fn stopped(&self) {
        self.tasks.wait().await;
    }

    /// A stream of the events of `item` (None: every item the agent knows, including
    /// items loaded later) from `from_sequence` of each pool on.
    pub fn stream(
        self: &Arc<Self>,
        item: Option<Arc<Item>>,
        from_sequence: u64,
    ) -> mpsc::Receiver<pb::ReservationEvent> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        if *self.stop.borrow() {
            return rx;
        }
        let feed = Arc::clone(self);
        self.tasks.spawn(async move { feed.follow(item, from_sequence.max(1), tx).await });
        rx
    }

    async fn follow(&self, item: Option<Arc<Item>>, from: u64, tx: mpsc::Sender<pb::ReservationEvent>) {
        let mut stop = self.stop.subscribe();
        let mut cursors: HashMap<String, Cursor> = HashMap::new();
        // Pools whose last page was full: read again at once.
        let mut behind: HashSet<String> = HashSet::new();
        let mut read_all = true;
        loop {
            // Armed before reading, so a write during the read is not missed.
            let written = self.written.notified();
            tokio::pin!(written);
            written.as_mut().enable();
            let pools: Vec<PoolKey> = match &item {
                Some(it) => it.pools.clone(),
                None => self.items.all().iter().flat_map(|it| it.pools.clone()).collect(),
            };
            for pool in &pools {
                let writes = self.writes(&pool.item_id);
                // Cursors per pool: a segmented item has one per segment.
                let tag = pool.hash_tag();
                let known = cursors.get(&tag).map(|c| c.writes);
                if !read_all && known == Some(writes) && !behind.contains(&tag) {
                    continue;
                }
                match self.send_page(pool, from, writes, &mut cursors, &tx).await {
                    Ok(true) => behind.insert(tag),
                    Ok(false) => behind.remove(&tag),
                    Err(Closed) => return,
                };
            }
            read_all = false;
            if !behind.is_empty() {
                continue;
            }
            let pools = u64::try_from(pools.len()).unwrap_or(u64::MAX);
            let backstop = POLL.max(Duration::from_millis(pools.saturating_mul(1_000) / BACKSTOP_READS_PER_SEC));
            tokio::select! {
                _ = &mut written => {}
                _ = tokio::time::sleep(backstop) => read_all = true,
                _ = stopped(&mut stop) => return,
                _ = tx.closed() => return,
            }
        }
    }

    /// Sends one page of `pool`'s events past its cursor; whether the page was full.
    /// `writes`: this agent's write count of the pool, read before the page.
    async fn send_page(
        &self,
        pool: &PoolKey,
        from: u64,
        writes: u64,
        cursors: &mut HashMap<String, Cursor>,
        tx: &mpsc::Sender<pb::ReservationEvent>,
    ) -> Result<bool, Closed> {
        let cursor = cursors.entry(pool.hash_tag()).or_insert(Cursor { generation: 0, next: from, writes });
        cursor.writes = writes;
        let page = match self.store.events(pool, cursor.next, PAGE).await {
            Ok(page) => page,
            Err(e) => {
                tracing::debug!(item = %pool.item_id, error = %e, "event stream: cannot read the outbox");
                return Ok(false);
            }
        };
        if page.generation != cursor.generation {
            if cursor.generation != 0 {
                // The pool was created anew: its numbering started again at 1.
                cursor.next = 1;
                cursor.generation = page.generation;
                return Ok(true);
            }
            cursor.generation = page.generation;
        }
        let full = page.events.len() as u64 >= PAGE;
        for e in &page.events {
            tx.send(event_pb(pool, page.generation, e)).await.map_err(|_| Closed)?;
            cursor.next = e.sequence.saturating_add(1);
        }
        Ok(full)
    }
}

/// The client went away.
struct Closed;

/// Resolves once the feed is stopped (the guard `wait_for` returns is not Send, so it is
/// dropped here).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
