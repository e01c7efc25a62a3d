//! The bound on `/metrics`' per-item series: with more items than the limit
//! (`--metrics-per-item-limit`), at most that many items keep series labelled with their
//! id (those that need an operator first), and the rest are summed into series without the
//! `item` label, as Prometheus users expect of a high-cardinality label. Sums over items
//! (`sum by (channel)`, conservation) stay right, since every unit is counted once: either
//! under its item or in the folded sum.

use crate::store::ItemLedger;

/// Items shown with their own series unless an operator sets another limit.
pub const DEFAULT_PER_ITEM_LIMIT: usize = 1_000;

/// The items of one scrape, split.
#[derive(Debug)]
pub struct Split<'a> {
    /// Items with series of their own, in item order.
    pub shown: Vec<&'a ItemLedger>,
    /// Items summed into the series without the item label.
    pub folded: Vec<&'a ItemLedger>,
}

/// Every item is shown while there are at most `limit`; above it, the items an alert looks
/// at (a drift, units in doubt, a ledger that does not add up) are shown first, in item
/// order, up to `limit`, and the rest folded.
pub fn split(ledgers: &[ItemLedger], limit: usize) -> Split<'_> {
    if ledgers.len() <= limit {
        return Split { shown: ledgers.iter().collect(), folded: Vec::new() };
    }
    let mut shown = Vec::with_capacity(limit);
    let mut folded = Vec::with_capacity(ledgers.len() - limit.min(ledgers.len()));
    for l in ledgers {
        if shown.len() < limit && needs_attention(l) {
            shown.push(l);
        } else {
            folded.push(l);
        }
    }
    Split { shown, folded }
}

/// What the alert rules watch per item: drift, units in doubt, and conservation.
fn needs_attention(l: &ItemLedger) -> bool {
    let held: u64 = l.channels.iter().map(|c| c.allocation.held()).sum();
    l.item.state.total != l.item.state.available + held
        || l.channels.iter().any(|c| c.allocation.drift() != 0 || c.allocation.in_doubt > 0)
}
