//! What a run exercised, to show the faults and the rules' paths really happened.

macro_rules! stats {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        /// Counts of what happened in a run (or, summed, in a sweep).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Stats {
            $($(#[$doc])* pub $field: u64,)*
        }

        impl Stats {
            /// Adds another run's counts.
            pub fn add(&mut self, o: &Stats) {
                $(self.$field += o.$field;)*
            }
        }
    };
}

stats! {
    crashes,
    lost_messages,
    retries,
    /// Calls the link gave up on (outcome unknown).
    give_ups,
    replays_answered,
    /// Short Borrows the center shared by the channels' sell rates.
    shared_borrows,
    stale_refused,
    /// ... of which calls of the running incarnation begun before its re-registration.
    stale_refused_own,
    reclaims,
    /// Items an operator had to resolve at quiescence (units in doubt)...
    resolutions,
    /// ... of which neither a pool store had lost data nor a reclaim put units in doubt.
    resolutions_without_data_loss,
    /// ... of units a reclaim without the agent's last word put in doubt.
    resolutions_after_reclaim,
    /// Reclaims of a channel whose last report was not its last word (units in doubt)...
    reclaims_into_doubt,
    /// ... and reclaims of a drained channel (units back on sale).
    reclaims_on_sale,
    /// Items an agent stopped selling because the center holds units of them in doubt.
    held_in_doubt,
    /// A running agent heard it was fenced and registered again...
    fenced_reregistrations,
    /// ... while Borrow/Return calls of its were in flight.
    fenced_with_calls_in_flight,
    /// A registration's resync queued behind another operation of the item.
    resyncs_waiting_for_a_call,
    /// Borrows/Returns whose outcome stayed unknown (a resync was scheduled).
    unknown_outcomes,
    /// Outages of the center's database...
    outages,
    /// ... and calls applied when it came back.
    applied_after_outage,
    /// Pool stores that reached their memory limit for a while...
    stores_full,
    /// ... stocking writes they refused...
    store_writes_refused,
    /// ... and grants that went back to the center because the store refused them.
    grants_given_back,
    /// Calls of unknown outcome answered for by their replay before a resync described.
    settled_by_replay,
    /// Scheduled resyncs that asked the center.
    item_resyncs,
    /// Calls delivered because their deadline was about to pass.
    late_landings,
    /// Pools created before their first Borrow.
    pools_opened,
    /// Pool stores that lost a pool's data...
    pool_losses,
    /// ... while its agent was down or had no generation of it recorded...
    pool_losses_unrecorded,
    /// ... while a Borrow of the pool was out.
    pool_losses_during_borrow,
    /// Pools a store put back to an earlier copy (same generation, older contents)...
    pool_rollbacks,
    /// ... and pools the agent's store layer found below its floor (lost).
    rollbacks_caught,
    /// Items an agent stopped selling because a heartbeat answer listed them in doubt.
    frozen_by_center,
    /// Pools the center marked lost because a report came with another generation.
    generation_changes,
    /// Resyncs that added or removed units.
    resync_moves,
    /// Registration resyncs whose DescribeItem saw another `held` than the registration
    /// answered (calls under the new epoch landed in between).
    registration_held_moved,
    /// Registrations whose resyncs did not all finish.
    registrations_failed,
    /// Grants not refilled because the pool was found lost after the grant.
    refills_withheld,
    /// Grants whose refill found the pool missing (lost in the refill window).
    refills_of_missing_pools,
    /// Pools fenced by a registration above an epoch in use...
    fences_raised,
    /// ... and store calls (refill, take, untake) of an older incarnation refused.
    store_calls_fenced,
    /// Calls whose first attempt went out under the epoch their operation read before its
    /// pool writes while the link already held a later one.
    calls_sent_under_their_pool_epoch,
    /// Items frozen (lost pool or units in doubt) that sold again while the agent ran.
    unfrozen,
    /// Registration resyncs that left out units because an outcome was unknown.
    registration_adds_withheld,
    /// Pools the center marked lost while the channel held none of them.
    lost_pools_without_units,
    /// Units by which running agents' pools differed from the center once everything in
    /// flight had landed: they wait for a resync.
    drift_waiting_for_resync,
    sold,
}
