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
    /// Units taken for a Return the center refused that the store would not put back
    /// (refused or failed): the rules ask for a resync, which puts them back.
    untakes_failed,
    /// An agent's event stream fell behind and was opened again (`World::watch_lag`)...
    watch_lags,
    /// ... and the events its agent never heard.
    events_missed,
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
    /// ... of which left the pool hash (a structure evicted): stamps still show it.
    pool_losses_hash_left,
    /// Heartbeats' pool reports taken from the last whole read (the stamp had not moved)...
    quiet_reports,
    /// ... of which of a pool lost with its hash left (the loss told a heartbeat later).
    quiet_reports_of_lost_pools,
    /// Refills answered with the pool as they left it (`Reply::Wrote`).
    write_answers,
    /// Rebalancer looks decided from the last whole look (the stamp had not moved)...
    quiet_looks,
    /// ... of which of a pool lost with its hash left (the loss found by a later call).
    quiet_looks_of_lost_pools,
    /// Pools a store put back to an earlier copy (same generation, older contents)...
    pool_rollbacks,
    /// ... and pools the agent's store layer found below its floor (lost)...
    rollbacks_caught,
    /// ... and pools whose every witness died first: the process that saw the later writes
    /// crashed (or exited without its last report) before it touched the pool again, and
    /// no report or Return had told the center (a store that acknowledged writes it did
    /// not keep, and died with the agent)...
    rollbacks_unwitnessed,
    /// ... whose forgotten sold units the product cannot know of: they may be sold again.
    units_forgotten_unwitnessed,
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
    /// Items created with a schedule...
    scheduled_items,
    /// ... that opened, by the center's clock...
    openings,
    /// ... whose opening the operator moved before it came...
    reschedules,
    /// ... whose end the operator moved after the opening (earlier: an early close)...
    ends_moved,
    early_closes,
    /// ... and that the center closed when their end came.
    closes_by_schedule,
    /// Acquires answered NOT_STARTED from memory.
    not_started_answers,
    /// Opening stocks borrowed during the lead.
    prestocks,
    /// Items created with channel shares (weights, caps, floors)...
    items_with_shares,
    /// ... and Borrows the plan held back (a cap's room, a floor kept for another
    /// channel, or before the opening).
    planned_borrows,
    /// Reservations made against the center's schedule by an agent that had not yet heard
    /// the schedule's move (the notification's window).
    sold_on_stale_schedule,
    /// Acquires that waited for their Borrow while the sale closed or its opening moved
    /// later, and answered their miss instead of trying the pool again.
    retries_past_the_schedule,
    /// Units left on the shelves of items closed by their schedule at the end of a run.
    closed_units_on_shelves,
    /// The center's ledger went back to an earlier state...
    ledger_rollbacks,
    /// ... taking this many units from the channels' `held`...
    units_lost_by_rollbacks,
    /// ... Borrows refused meanwhile because pools held units beyond the ledger...
    borrows_refused_beyond_ledger,
    /// ... drifts re-learned from the pools' reports, and their units...
    relearns,
    units_relearned,
    /// ... relearns that came up short (the units had been lent again), and by how much...
    relearns_short,
    units_lent_twice,
    /// ... runs whose buyers held more than the total at some step (units sold from two
    /// shelves), and the most units over the total in each, summed...
    runs_oversold_after_rollback,
    oversold_after_rollback,
    /// ... units still beyond the ledger at the end (the item no longer lent)...
    units_left_beyond_ledger,
    /// ... units a rollback put back with channels that had given them back (lost Returns)...
    units_returned_again_by_rollbacks,
    /// ... and of those, units still held for a channel at the end with no pool holding them
    /// (stranded: the sale ended without them).
    units_left_stranded_by_rollbacks,
    /// Registrations a rolled-back ledger answered with an epoch the channel's pools were
    /// already fenced with, units granted meanwhile that the pools refused as fenced (the
    /// registration above the fence counts them), and registrations sent again above a
    /// fence a resync found at or above their epoch.
    epochs_reused_by_rollbacks,
    units_granted_to_fenced_pools,
    registrations_above_fence,
    /// Registrations whose first report was refused (a stale epoch), so the agent
    /// registered again.
    registrations_report_refused,
    sold,
}
