//! The resync plan: how a pool is brought in line with what the center says the channel
//! holds of its item. A pure function of the two views.

use super::{Holding, PoolView};

/// What a resync does to one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncPlan {
    /// The channel holds nothing of the item: align the pool to `target` (0) and sell,
    /// even if the pool had been lost (nothing was lost).
    Unfreeze { target: u64 },
    /// The store lost the pool while the channel held units: never resell them.
    Lost,
    /// The pool is intact, but the center holds some of its units in doubt: sell nothing,
    /// keep reporting the pool as it is.
    InDoubt,
    /// Make the pool's total `target`: add units granted but never added, remove units the
    /// center no longer counts as the channel's.
    Align { target: u64 },
    /// An operator settled the doubt: align to `target` (what the channel holds now) and
    /// sell again.
    Resume { target: u64 },
}

/// The plan for a pool read after the center's view of the channel's holding.
/// `only_remove`: an outcome of the item is unknown (a late attempt may still land), so
/// units are only taken away; a later resync adds what is missing.
pub fn resync_plan(holding: &Holding, pool: &PoolView, only_remove: bool) -> ResyncPlan {
    if holding.held == 0 && holding.in_doubt == 0 {
        return ResyncPlan::Unfreeze { target: 0 };
    }
    let lost = (pool.generation == 0 && holding.held > 0)
        || (holding.generation != 0 && pool.generation != 0 && pool.generation != holding.generation);
    if lost {
        return ResyncPlan::Lost;
    }
    if holding.in_doubt > 0 {
        return ResyncPlan::InDoubt;
    }
    let target = if only_remove { holding.held.min(pool.total()) } else { holding.held };
    ResyncPlan::Align { target }
}
