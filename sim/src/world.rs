//! The simulated world: the center, the channels (each a durable pool store and, while
//! its process runs, the agent's volatile memory: one [`ItemCore`] per item), the network
//! between them, the buyers, and the reference model the checker compares against.

use std::collections::{BTreeMap, VecDeque};

use inventory_core::channel::{ItemCore, OpId, OpKind, PoolStamp, Work};
use inventory_core::ledger::ItemState;
pub use inventory_core::pool::{AcquireArgs, AcquireResult, Pool, PoolError, ReservationState, Transition};
use inventory_core::watermarks::{RateBatching, Watermarks};
use inventory_core::{Channel, ItemId};

use crate::center::{Answer, Center, CenterEvent, CenterItem, Holding, Refusal, qty};
use crate::config::{CHANNELS, Config, ITEMS, Violation};
use crate::rng::Rng;
use crate::rollback::LedgerHistory;
use crate::schedules::Schedules;
use crate::stats::Stats;

/// Records are never forgotten in a run (the real retention is 24 h, far beyond one).
pub const RECORD_RETENTION_MS: i64 = i64::MAX;

/// A refusal of the pool model the simulator never provokes (a counter out of range, a
/// reused reservation id): a broken invariant 3.
pub fn broken(e: PoolError) -> Violation {
    Violation::new("3", format!("pool model: {e}"))
}

/// One channel: its pool store (durable) and its agent process (volatile).
#[derive(Debug, Clone)]
pub struct Agent {
    pub channel: Channel,
    /// Durable: survives crashes (Redis with persistence).
    pub pools: BTreeMap<String, Pool>,
    /// `None` while down.
    pub mem: Option<AgentMem>,
    /// Down after a graceful stop whose final report the center took.
    pub stopped_gracefully: bool,
    pub incarnations: u64,
    /// The pool store is at its memory limit until then: it refuses stocking writes
    /// (refills, takes, fences, new pools) before writing anything.
    pub store_full_until: Option<i64>,
    /// Copies of pools the store saved (a snapshot), with the agent's incarnation then,
    /// to go back to ([`World::roll_back_pool`]).
    pub saved: BTreeMap<String, (u64, Pool)>,
    /// While a second process of the channel runs ([`World::rival`]): its store layer's
    /// floors, which it learns from the center alone.
    pub rival_floors: BTreeMap<String, u64>,
    /// Pools lost with their hash left (one of their structures evicted): a whole read
    /// finds them lost, a stamp still shows what the hash held ([`World::stamp`]).
    pub stamps_left: BTreeMap<String, PoolStamp>,
    /// Each pool's stamp at its last whole read, for [`Breakage::stamps_miss_writes`](crate::Breakage).
    pub stamps_read: BTreeMap<String, PoolStamp>,
}

impl Agent {
    pub fn name(&self) -> &str {
        self.channel.as_str()
    }
}

/// A running agent's memory, lost on a crash: the link's state, each item's rules and
/// what the driver is in the middle of.
#[derive(Debug, Clone)]
pub struct AgentMem {
    pub incarnation: u64,
    /// The link's epoch (0 before the first registration).
    pub epoch: u64,
    /// The link's lease (`CenterLink::lease_until_ms`); 0: none.
    pub lease_until_ms: i64,
    /// Calls in a row without an answer (`CenterLink::failures_in_a_row`).
    pub unanswered: u32,
    pub last_heartbeat_ms: i64,
    pub items: BTreeMap<String, Slot>,
    /// The WatchChannel stream: one TCP stream, so in order.
    pub events: VecDeque<CenterEvent>,
    /// The operation the event watcher awaits (a give-back, a resolution's resync).
    pub watcher_awaits: Option<(String, OpId)>,
    /// A registration under way (the heartbeat worker awaits it).
    pub registering: Option<Registration>,
    /// The start-up registration succeeded: the workers (rebalancer, heartbeat, event
    /// watcher) run from then on, as `Application::run_until` starts them after `build`.
    pub started: bool,
    /// SIGTERM received.
    pub stopping: Option<Stopping>,
    /// Acquires whose Borrow finished, to try the pool once more.
    pub wakeups: Vec<Wakeup>,
    /// The store layer's floor per pool: the highest write sequence its calls saw.
    pub floors: BTreeMap<String, u64>,
}

impl AgentMem {
    pub fn lease_valid(&self, now_ms: i64) -> bool {
        now_ms < self.lease_until_ms
    }
}

/// One item in a running agent: its rules and the effect under way.
#[derive(Debug, Clone)]
pub struct Slot {
    pub core: ItemCore,
    /// The running operation's next effect, not yet carried out.
    pub work: Option<Work>,
    /// The running operation's Borrow or Return, while the link works on it.
    pub call: Option<Call>,
    /// What each queued or running operation is (for the trace and the stats).
    pub kinds: BTreeMap<OpId, OpKind>,
    /// The center's answer to the running resync's DescribeItem.
    pub described: Option<(OpId, Holding)>,
    /// A Borrow whose grant came in (its pool check and refill follow).
    pub granted: Option<OpId>,
    /// Acquires waiting for an operation (a Borrow) to finish.
    pub misses: Vec<(OpId, Miss)>,
}

/// A Borrow or Return the link is carrying: every attempt with the same request id and
/// epoch.
#[derive(Debug, Clone)]
pub struct Call {
    pub op: OpId,
    pub borrow: bool,
    pub request_id: String,
    pub quantity: u64,
    pub epoch: u64,
    pub attempt: u32,
    /// A Borrow's sell rate, as the rules put it in the effect.
    pub sell_rate_milli: u64,
    /// A Return's pool write sequence: the store layer's floor once its take was
    /// acknowledged (`ReturnRequest.write_seq_floors`; 0 for a Borrow).
    pub write_seq: u64,
}

/// An Acquire that found the pool empty and waits for its Borrow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Miss {
    pub user: String,
    pub quantity: u64,
    pub key: String,
    /// The buyer's key use (see [`KeyUse`]).
    pub key_use: usize,
    pub at_ms: i64,
    /// The shelf version the Acquire was admitted with.
    pub shelf: u64,
    /// What the pool had when the store said sold out.
    pub available: u64,
}

/// A [`Miss`] whose operation finished at `finished_at_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wakeup {
    pub item: String,
    pub miss: Miss,
    pub finished_at_ms: i64,
}

/// `Agent::register`: the resyncs it awaits, then the lease from the send time.
#[derive(Debug, Clone)]
pub struct Registration {
    pub sent_at_ms: i64,
    pub epoch: u64,
    /// The holdings the registration answered, by item.
    pub held: BTreeMap<String, Holding>,
    pub pending: Vec<(String, OpId)>,
    pub failed: bool,
    /// The highest fence a resync found at or above the epoch (0: none): the epoch was
    /// handed out before, and the agent registers again above it.
    pub fenced_at: u64,
    /// The start-up registration (retried until it succeeds), not the heartbeat worker's.
    pub startup: bool,
}

/// A graceful stop: workers finish what they await, then every item gives back its idle
/// units in turn, every operation finishes, and the final report goes out.
#[derive(Debug, Clone)]
pub struct Stopping {
    /// Items still to give back.
    pub left: VecDeque<String>,
    /// The give-back under way.
    pub awaits: Option<(String, OpId)>,
    /// The drain's first report went out (before its first take).
    pub reported: bool,
}

/// A Borrow/Return attempt or its reply in flight. Separate calls are separate HTTP/2
/// streams, so they may arrive in any order; a message is never duplicated by the
/// network (duplicates come from retries).
#[derive(Debug, Clone)]
pub enum Message {
    Request {
        sent_at_ms: i64,
        channel: usize,
        incarnation: u64,
        epoch: u64,
        borrow: bool,
        item: String,
        quantity: u64,
        request_id: String,
        attempt: u32,
        /// A Borrow's sell rate (units/s × 1000).
        sell_rate_milli: u64,
        /// A Return's pool write sequence after its take (see [`Call::write_seq`]).
        write_seq: u64,
    },
    Reply {
        sent_at_ms: i64,
        channel: usize,
        incarnation: u64,
        item: String,
        request_id: String,
        attempt: u32,
        result: Result<Answer, Refusal>,
    },
}

impl Message {
    pub fn sent_at_ms(&self) -> i64 {
        match self {
            Message::Request { sent_at_ms, .. } | Message::Reply { sent_at_ms, .. } => *sent_at_ms,
        }
    }
}

/// An idempotency key a buyer used, for replays.
#[derive(Debug, Clone)]
pub struct KeyUse {
    pub channel: usize,
    pub item: String,
    pub key: String,
    pub user: String,
    pub quantity: u64,
    /// The reservation this key made, if it reserved, and the pool's data-loss count then.
    pub reservation: Option<(String, u32)>,
}

/// What the checker knows beyond the system's own state.
#[derive(Debug, Clone, Default)]
pub struct Reference {
    /// Heartbeat reports of counts the pool did not hold when they were sent (invariant R).
    pub untrue_reports: Vec<String>,
    /// (channel, item) -> units reclaimed by the center (or returned to it by an in-doubt
    /// resolution) that the agent has not yet removed from its pool, each with the
    /// [`Center::changes`] count that took them. Until a resync with a view of the center
    /// at least that recent, the pool legitimately holds more than the channel's.
    pub reclaimed_unsynced: BTreeMap<(usize, String), Vec<(u64, u64)>>,
    /// (channel, item, grant id) -> refills that added units.
    pub refills: BTreeMap<(usize, String, String), u32>,
    /// (channel, item) -> how often the pool's store lost its data.
    pub pool_losses: BTreeMap<(usize, String), u32>,
    /// (channel, item) -> units sold in pool data that was lost (they stay sold).
    pub lost_sold: BTreeMap<(usize, String), u64>,
    /// (channel, item) -> units an operator wrote off as sold when resolving in-doubt
    /// units: they left the ledger's total but may still show as sold in the pool.
    pub written_off: BTreeMap<(usize, String), u64>,
    /// (channel, item) -> units a reclaim without the agent's last word put in doubt (a
    /// legitimate doubt without any data loss).
    pub reclaimed_into_doubt: BTreeMap<(usize, String), u64>,
    /// (channel, item) -> sold units a pool rollback forgot that no process has caught
    /// yet (the running process will at its next call on the pool).
    pub rollback_unseen: BTreeMap<(usize, String), u64>,
    /// (channel, item) -> sold units of rollbacks whose every witness died
    /// ([`crate::stats::Stats::rollbacks_unwitnessed`]): they may exist twice.
    pub unwitnessed: BTreeMap<(usize, String), u64>,
}

impl Reference {
    /// Units taken from the channel's pool behind its agent's back (reclaim, in-doubt
    /// resolution) at center change `as_of`.
    pub fn unsynced(&mut self, c: usize, item: &str, as_of: u64, units: u64) {
        if units > 0 {
            self.reclaimed_unsynced.entry((c, item.to_owned())).or_default().push((as_of, units));
        }
    }

    /// A resync (or an in-doubt resolution heard) with the center's view as of `as_of`
    /// has removed what was taken until then.
    pub fn synced(&mut self, c: usize, item: &str, as_of: u64) {
        let key = (c, item.to_owned());
        if let Some(list) = self.reclaimed_unsynced.get_mut(&key) {
            list.retain(|(at, _)| *at > as_of);
            if list.is_empty() {
                self.reclaimed_unsynced.remove(&key);
            }
        }
    }

    /// Units taken from the channel's pool that its agent has not removed yet.
    pub fn reclaimed(&self, c: usize, item: &str) -> u64 {
        self.reclaimed_unsynced.get(&(c, item.to_owned())).map_or(0, |l| l.iter().map(|(_, u)| u).sum())
    }
}

/// Everything in one simulated run.
#[derive(Debug, Clone)]
pub struct World {
    pub config: Config,
    pub rng: Rng,
    pub now_ms: i64,
    pub center: Center,
    pub agents: Vec<Agent>,
    pub network: Vec<Message>,
    /// While the center's database does not answer: until when.
    pub center_down_until: Option<i64>,
    /// Calls that reached the center during an outage, applied when it ends.
    pub parked: Vec<Message>,
    pub keys: Vec<KeyUse>,
    /// Reservations buyers know of: (channel, item, reservation id).
    pub reservations: Vec<(usize, String, String)>,
    pub reference: Reference,
    /// Scheduled items and the agents' clocks.
    pub sched: Schedules,
    /// Copies of the ledger for rollbacks, and the center's drift sampler.
    pub ledger: LedgerHistory,
    pub stats: Stats,
    pub trace: Vec<String>,
    pub step: usize,
    next_id: u64,
    next_generation: u64,
}

impl World {
    /// A world of 1–2 items and 2–4 channels with stock and settings drawn from the seed.
    pub fn new(seed: u64, config: Config) -> Self {
        let mut rng = Rng::new(seed);
        let n_items = rng.index(ITEMS.len()) + 1;
        let n_channels = rng.index(CHANNELS.len() - 1) + 2;
        let mut center = Center::default();
        for (n, name) in ITEMS[..n_items].iter().enumerate() {
            let total = rng.range(10, 60);
            let per_user_limit = rng.range(1, 3);
            let ttl = rng.range(300, 3_000);
            let batch = rng.range(1, 10);
            let low = rng.range(0, batch);
            let high = low + rng.range(1, 2 * batch);
            let watermarks = Watermarks::new(low, high, batch).expect("low < high, batch >= 1");
            center.items.insert(
                (*name).to_owned(),
                CenterItem {
                    id: ItemId::parse("item_id", name).expect("valid"),
                    state: ItemState::new(qty(total), per_user_limit, ttl),
                    watermarks,
                    // Every other seed's items follow their sell rates (decided without a
                    // draw, so the seeds' other settings stay what they were).
                    rate_batching: seed.wrapping_add(n as u64).is_multiple_of(2).then_some(RateBatching {
                        min_batch: 1,
                        max_batch: 2 * batch,
                        target_ms: 1_000,
                    }),
                },
            );
        }
        let agents = CHANNELS[..n_channels]
            .iter()
            .map(|c| Agent {
                channel: Channel::parse("channel", c).expect("valid"),
                pools: BTreeMap::new(),
                mem: None,
                stopped_gracefully: false,
                incarnations: 0,
                store_full_until: None,
                saved: BTreeMap::new(),
                rival_floors: BTreeMap::new(),
                stamps_left: BTreeMap::new(),
                stamps_read: BTreeMap::new(),
            })
            .collect();
        let mut world = Self {
            config,
            rng,
            now_ms: 1_000,
            center,
            agents,
            network: Vec::new(),
            center_down_until: None,
            parked: Vec::new(),
            keys: Vec::new(),
            reservations: Vec::new(),
            reference: Reference::default(),
            sched: Schedules::default(),
            ledger: LedgerHistory::default(),
            stats: Stats::default(),
            trace: Vec::new(),
            step: 0,
            next_id: 0,
            next_generation: 0,
        };
        let summary: Vec<String> = world
            .center
            .items
            .iter()
            .map(|(n, i)| {
                format!(
                    "{n}: total {} limit {} ttl {} wm {}/{}/{}",
                    i.state.total,
                    i.state.per_user_limit,
                    i.state.reservation_ttl_ms,
                    i.watermarks.low,
                    i.watermarks.high,
                    i.watermarks.batch
                )
            })
            .collect();
        world.log(format!("world: channels {:?}; {}", &CHANNELS[..n_channels], summary.join("; ")));
        world.plan_schedules();
        world.plan_shares();
        world
    }

    pub fn item_names(&self) -> Vec<String> {
        self.center.items.keys().cloned().collect()
    }

    /// A fresh id, unique in the run (request ids, take ids, reservation ids, keys).
    pub fn fresh_id(&mut self, prefix: &str) -> String {
        self.next_id += 1;
        format!("{prefix}{}", self.next_id)
    }

    pub fn fresh_generation(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }

    pub fn log(&mut self, line: String) {
        self.trace.push(format!("#{:<4} t={:<6} {line}", self.step, self.now_ms));
    }
}
