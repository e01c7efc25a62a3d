//! The relay against an outbox and a broker kept in memory.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;

/// A pool's generation, its events kept (by sequence), and its last sequence.
type FakePool = (u64, BTreeMap<u64, pb::ReservationEvent>, u64);

#[derive(Default)]
struct FakeOutbox {
    pools: Mutex<BTreeMap<String, FakePool>>,
}

impl FakeOutbox {
    fn write(&self, pool: &PoolKey, generation: u64, n: u64) {
        let mut pools = self.pools.lock().unwrap();
        let entry = pools.entry(pool.item_id.clone()).or_insert((generation, BTreeMap::new(), 0));
        if entry.0 != generation {
            *entry = (generation, BTreeMap::new(), 0);
        }
        for _ in 0..n {
            entry.2 += 1;
            let seq = entry.2;
            entry.1.insert(seq, event(pool, generation, seq));
        }
    }

    fn kept(&self, pool: &PoolKey) -> Vec<u64> {
        self.pools.lock().unwrap().get(&pool.item_id).map(|p| p.1.keys().copied().collect()).unwrap_or_default()
    }
}

fn event(pool: &PoolKey, generation: u64, sequence: u64) -> pb::ReservationEvent {
    pb::ReservationEvent {
        event_id: format!("{}:{}:0:{generation}:{sequence}", pool.channel, pool.item_id),
        channel: pool.channel.clone(),
        item_id: pool.item_id.clone(),
        sequence,
        pool_generation: generation,
        at_unix_ms: 1_000,
        ..Default::default()
    }
}

#[async_trait]
impl Outbox for FakeOutbox {
    async fn read(&self, pool: &PoolKey, from_sequence: u64, max: u64) -> Result<OutboxPage, StoreError> {
        let pools = self.pools.lock().unwrap();
        let Some((generation, events, last)) = pools.get(&pool.item_id) else {
            return Err(StoreError::PoolMissing(pool.hash_tag()));
        };
        let first_kept = events.keys().next().copied().unwrap_or(last + 1);
        let events =
            events.range(from_sequence..).take(usize::try_from(max).unwrap()).map(|(_, e)| e.clone()).collect();
        Ok(OutboxPage { generation: *generation, events, last_sequence: *last, first_kept })
    }

    async fn trim(&self, pool: &PoolKey, generation: u64, through_sequence: u64) -> Result<u64, StoreError> {
        let mut pools = self.pools.lock().unwrap();
        let Some((kept, events, _)) = pools.get_mut(&pool.item_id) else { return Ok(0) };
        if *kept != generation {
            return Ok(0);
        }
        let keep = events.split_off(&(through_sequence + 1));
        let dropped = events.len() as u64;
        *events = keep;
        Ok(dropped)
    }
}

/// A broker that keeps what it acknowledged, dropping repeated ids like JetStream does,
/// and can be told to fail, or to acknowledge only the first few of the next batch.
#[derive(Default)]
struct FakeSink {
    down: std::sync::atomic::AtomicBool,
    ack_only: Mutex<Option<usize>>,
    received: Mutex<Vec<String>>,
    sent: AtomicU64,
}

#[async_trait]
impl EventSink for FakeSink {
    async fn publish(&self, events: &[pb::ReservationEvent]) -> Published {
        if self.down.load(Ordering::Relaxed) {
            return Published { acked: 0, error: Some(SinkError::Unavailable("connection refused".into())) };
        }
        let take = self.ack_only.lock().unwrap().take().unwrap_or(events.len()).min(events.len());
        let mut received = self.received.lock().unwrap();
        for e in &events[..take] {
            self.sent.fetch_add(1, Ordering::Relaxed);
            if !received.contains(&e.event_id) {
                received.push(e.event_id.clone());
            }
        }
        let error = (take < events.len()).then(|| SinkError::Unavailable("ack timed out".into()));
        Published { acked: take, error }
    }
}

fn relay(outbox: &Arc<FakeOutbox>, sink: &Arc<FakeSink>, batch_max: u64) -> Relay {
    let settings = RelaySettings { batch_max, ..RelaySettings::default() };
    Relay::new(
        Arc::clone(outbox) as Arc<dyn Outbox>,
        Arc::clone(sink) as Arc<dyn EventSink>,
        Arc::new(RelayStatus::default()),
        settings,
    )
}

fn pools() -> Vec<PoolKey> {
    vec![PoolKey::new("web", "a"), PoolKey::new("web", "b")]
}

#[tokio::test]
async fn every_event_is_published_then_trimmed() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    outbox.write(&pools()[0], 1, 5);
    outbox.write(&pools()[1], 1, 3);
    let mut relay = relay(&outbox, &sink, 2);
    // Batches of 2, up to 8 per pool per pass: one pass drains both.
    let pass = relay.pass(&pools()).await;
    assert_eq!(pass, Pass { published: 8, failed: false, more: false });
    assert_eq!(sink.received.lock().unwrap().len(), 8);
    assert!(outbox.kept(&pools()[0]).is_empty());
    assert!(outbox.kept(&pools()[1]).is_empty());
    assert_eq!(relay.status.published_sequence(&pools()[0], 1), 5);
    assert_eq!(relay.status.published_sequence(&pools()[0], 2), 0);
    assert_eq!(relay.status.published_total(), 8);
    // Nothing new: nothing sent again.
    assert_eq!(relay.pass(&pools()).await.published, 0);
    assert_eq!(sink.sent.load(Ordering::Relaxed), 8);
}

#[tokio::test]
async fn a_broker_down_keeps_the_outbox_until_it_is_back() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    sink.down.store(true, Ordering::Relaxed);
    outbox.write(&pools()[0], 1, 4);
    let mut relay = relay(&outbox, &sink, 10);
    let pass = relay.pass(&pools()).await;
    assert!(pass.failed);
    assert_eq!(outbox.kept(&pools()[0]), [1, 2, 3, 4]);
    assert_eq!(relay.status.failures_total(), 1);
    let p = relay.status.progress(&pools()[0]).unwrap();
    assert_eq!((p.published, p.last_sequence, p.oldest_unpublished_ms), (0, 4, 1_000));
    // More sales while the broker is down: the outbox grows.
    outbox.write(&pools()[0], 1, 2);
    assert!(relay.pass(&pools()).await.failed);
    sink.down.store(false, Ordering::Relaxed);
    assert_eq!(relay.pass(&pools()).await.published, 6);
    assert!(outbox.kept(&pools()[0]).is_empty());
    assert_eq!(relay.status.progress(&pools()[0]).unwrap().oldest_unpublished_ms, 0);
}

#[tokio::test]
async fn a_partial_acknowledgement_trims_only_the_acknowledged_run() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    outbox.write(&pools()[0], 1, 5);
    *sink.ack_only.lock().unwrap() = Some(2);
    let mut relay = relay(&outbox, &sink, 10);
    let pass = relay.pass(&pools()[..1]).await;
    assert_eq!((pass.published, pass.failed), (2, true));
    assert_eq!(outbox.kept(&pools()[0]), [3, 4, 5]);
    assert_eq!(relay.status.published_sequence(&pools()[0], 1), 2);
    // The rest goes next time, from 3 on.
    assert_eq!(relay.pass(&pools()[..1]).await.published, 3);
    assert_eq!(sink.sent.load(Ordering::Relaxed), 5);
}

#[tokio::test]
async fn a_new_relay_resends_what_was_acknowledged_but_not_trimmed_and_the_broker_drops_it() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    outbox.write(&pools()[0], 1, 3);
    // A relay published 1..3 and died before trimming.
    for seq in 1..=3 {
        sink.received.lock().unwrap().push(event(&pools()[0], 1, seq).event_id);
    }
    let mut relay = relay(&outbox, &sink, 10);
    assert_eq!(relay.pass(&pools()[..1]).await.published, 3);
    assert_eq!(sink.received.lock().unwrap().len(), 3);
    assert!(outbox.kept(&pools()[0]).is_empty());
}

#[tokio::test]
async fn a_recreated_pool_is_published_from_its_first_event() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    outbox.write(&pools()[0], 1, 3);
    let mut relay = relay(&outbox, &sink, 10);
    assert_eq!(relay.pass(&pools()[..1]).await.published, 3);
    outbox.write(&pools()[0], 2, 2);
    assert_eq!(relay.pass(&pools()[..1]).await.published, 2);
    assert_eq!(relay.status.published_sequence(&pools()[0], 2), 2);
    let received = sink.received.lock().unwrap().clone();
    assert_eq!(&received[3..], ["web:a:0:2:1", "web:a:0:2:2"]);
}

#[tokio::test]
async fn a_busy_pool_yields_after_its_batches_and_says_there_is_more() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    outbox.write(&pools()[0], 1, 100);
    let mut relay = relay(&outbox, &sink, 5);
    // 8 batches of 5 per pass.
    let pass = relay.pass(&pools()[..1]).await;
    assert_eq!(pass, Pass { published: 40, failed: false, more: true });
    assert_eq!(outbox.kept(&pools()[0]).first(), Some(&41));
}

#[tokio::test]
async fn the_loop_publishes_only_while_leading_and_stops_on_shutdown() {
    let (outbox, sink) = (Arc::new(FakeOutbox::default()), Arc::new(FakeSink::default()));
    outbox.write(&pools()[0], 1, 3);
    let relay = relay(&outbox, &sink, 10);
    let status = Arc::clone(&relay.status);
    let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let lead = Arc::clone(&leading);
    let task = tokio::spawn(run(relay, pools, move || lead.load(Ordering::Relaxed), stop_rx));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sink.sent.load(Ordering::Relaxed), 0, "a follower publishes nothing");
    leading.store(true, Ordering::Relaxed);
    status.wake();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !outbox.kept(&pools()[0]).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the leader did not publish the outbox");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status.published_total(), 3);
    stop_tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(2), task).await.expect("the loop stops on shutdown").unwrap();
}
