//! `invctl reconcile --orders-db URL`: the pools against the order consumer's tables
//! (those `order-sink` keeps). Per channel and item, in the pool's current generation:
//! confirmed orders' units equal the pool's `sold`, reserved orders' units its
//! `reserved` (cancelled, expired and refunded orders hold nothing); each pool's event
//! numbers reached the orders without a gap; each order's state is the state of its
//! reservation's latest event; and, for the agents given with `--agent-for`, the relay's
//! published sequence equals the last event the orders saw.
//!
//! The pools are the center's view (each channel's last heartbeat report), so run this
//! on a settled sale: with sales in flight a report is up to a heartbeat behind.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use sqlx::Row;

/// One pool as the center (and, when asked, its agent) sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolFacts {
    pub channel: String,
    pub item_id: String,
    pub generation: u64,
    pub reserved: u64,
    pub sold: u64,
    /// GetStock's `published_event_sequence`, when the channel's agent was asked.
    pub published: Option<u64>,
}

/// What the orders tables hold for one pool generation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrderFacts {
    pub reserved_units: u64,
    pub confirmed_units: u64,
    /// Events seen: how many, and the highest sequence.
    pub events_seen: u64,
    pub max_sequence: u64,
    /// Orders whose state is not their reservation's latest event's.
    pub stale_orders: Vec<String>,
}

pub type Key = (String, String, u64);

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Difference {
    pub item_id: String,
    pub channel: String,
    pub check: String,
    pub detail: String,
}

fn diff(channel: &str, item_id: &str, check: &str, detail: String) -> Difference {
    Difference { item_id: item_id.to_owned(), channel: channel.to_owned(), check: check.to_owned(), detail }
}

/// Compares the pools with the orders: every difference found, none when they agree.
pub fn compare(pools: &[PoolFacts], orders: &BTreeMap<Key, OrderFacts>) -> Vec<Difference> {
    let mut out = Vec::new();
    let mut current = BTreeSet::new();
    for p in pools {
        let key = (p.channel.clone(), p.item_id.clone(), p.generation);
        current.insert((p.channel.clone(), p.item_id.clone()));
        let o = orders.get(&key).cloned().unwrap_or_default();
        let (c, i) = (p.channel.as_str(), p.item_id.as_str());
        if o.confirmed_units != p.sold {
            out.push(diff(
                c,
                i,
                "sold",
                format!("pool sold {} but confirmed orders hold {}", p.sold, o.confirmed_units),
            ));
        }
        if o.reserved_units != p.reserved {
            out.push(diff(
                c,
                i,
                "reserved",
                format!("pool reserved {} but reserved orders hold {}", p.reserved, o.reserved_units),
            ));
        }
        if let Some(published) = p.published
            && published != o.max_sequence
        {
            out.push(diff(
                c,
                i,
                "published",
                format!(
                    "the relay published through sequence {published} of generation {} but the orders saw through {}",
                    p.generation, o.max_sequence
                ),
            ));
        }
    }
    for ((c, i, generation), o) in orders {
        if o.events_seen != o.max_sequence {
            out.push(diff(
                c,
                i,
                "gap",
                format!(
                    "generation {generation}: {} of events 1..={} never reached the orders",
                    o.max_sequence.saturating_sub(o.events_seen),
                    o.max_sequence
                ),
            ));
        }
        if !o.stale_orders.is_empty() {
            out.push(diff(
                c,
                i,
                "state",
                format!(
                    "{} orders not in their reservation's latest state: {}",
                    o.stale_orders.len(),
                    o.stale_orders.iter().take(5).cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
        if !current.contains(&(c.clone(), i.clone())) && (o.reserved_units > 0 || o.confirmed_units > 0) {
            out.push(diff(c, i, "unknown pool", "orders of a pool the center does not know".to_owned()));
        }
    }
    out
}

fn unsigned(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// Reads the order consumer's tables.
pub async fn read(url: &str) -> Result<BTreeMap<Key, OrderFacts>, String> {
    use sqlx::Connection;
    let mut db = sqlx::PgConnection::connect(url).await.map_err(|e| format!("--orders-db: cannot connect: {e}"))?;
    let mut out: BTreeMap<Key, OrderFacts> = BTreeMap::new();
    let q = |e: sqlx::Error| format!("--orders-db: {e} (are these order-sink's tables?)");
    for r in sqlx::query(
        "SELECT channel, item_id, pool_generation,
                COALESCE(SUM(quantity) FILTER (WHERE state = 'reserved'), 0)::BIGINT,
                COALESCE(SUM(quantity) FILTER (WHERE state = 'confirmed'), 0)::BIGINT
         FROM orders GROUP BY 1, 2, 3",
    )
    .fetch_all(&mut db)
    .await
    .map_err(q)?
    {
        let o = out.entry((r.get(0), r.get(1), unsigned(r.get(2)))).or_default();
        o.reserved_units = unsigned(r.get(3));
        o.confirmed_units = unsigned(r.get(4));
    }
    for r in sqlx::query(
        "SELECT channel, item_id, pool_generation, COUNT(*), MAX(sequence) FROM order_events_seen GROUP BY 1, 2, 3",
    )
    .fetch_all(&mut db)
    .await
    .map_err(q)?
    {
        let o = out.entry((r.get(0), r.get(1), unsigned(r.get(2)))).or_default();
        o.events_seen = unsigned(r.get(3));
        o.max_sequence = unsigned(r.get(4));
    }
    for r in sqlx::query(
        "SELECT o.channel, o.item_id, o.pool_generation, o.reservation_id
         FROM orders o
         JOIN LATERAL (SELECT s.state FROM order_events_seen s
                       WHERE s.reservation_id = o.reservation_id
                       ORDER BY s.pool_generation DESC, s.sequence DESC LIMIT 1) latest ON true
         WHERE latest.state <> o.state
         ORDER BY 4",
    )
    .fetch_all(&mut db)
    .await
    .map_err(q)?
    {
        out.entry((r.get(0), r.get(1), unsigned(r.get(2)))).or_default().stale_orders.push(r.get(3));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(sold: u64, reserved: u64, published: Option<u64>) -> PoolFacts {
        PoolFacts { channel: "web".into(), item_id: "sku".into(), generation: 1, reserved, sold, published }
    }

    fn orders(facts: OrderFacts) -> BTreeMap<Key, OrderFacts> {
        BTreeMap::from([(("web".to_owned(), "sku".to_owned(), 1), facts)])
    }

    fn checks(d: &[Difference]) -> Vec<&str> {
        d.iter().map(|d| d.check.as_str()).collect()
    }

    #[test]
    fn agreeing_pools_and_orders_show_nothing() {
        let o = orders(OrderFacts {
            reserved_units: 2,
            confirmed_units: 5,
            events_seen: 9,
            max_sequence: 9,
            ..Default::default()
        });
        assert_eq!(compare(&[pool(5, 2, Some(9))], &o), []);
        assert_eq!(compare(&[pool(5, 2, None)], &o), []);
    }

    #[test]
    fn each_disagreement_is_listed() {
        let o = orders(OrderFacts {
            reserved_units: 1,
            confirmed_units: 4,
            events_seen: 7,
            max_sequence: 9,
            stale_orders: vec!["r7".into()],
        });
        let d = compare(&[pool(5, 2, Some(10))], &o);
        assert_eq!(checks(&d), ["sold", "reserved", "published", "gap", "state"]);
        assert_eq!(d[3].detail, "generation 1: 2 of events 1..=9 never reached the orders");
        assert_eq!(d[0].detail, "pool sold 5 but confirmed orders hold 4");
    }

    #[test]
    fn a_pool_without_orders_and_orders_without_a_pool_are_differences() {
        assert_eq!(checks(&compare(&[pool(3, 0, None)], &BTreeMap::new())), ["sold"]);
        let o = orders(OrderFacts { confirmed_units: 1, events_seen: 2, max_sequence: 2, ..Default::default() });
        assert_eq!(checks(&compare(&[], &o)), ["unknown pool"]);
        // Orders of an older generation of a known pool are history, not a difference.
        let mut older = o.clone();
        older.insert(("web".into(), "sku".into(), 2), OrderFacts::default());
        let current = PoolFacts { generation: 2, ..pool(0, 0, None) };
        assert_eq!(compare(&[current], &older), []);
    }
}
