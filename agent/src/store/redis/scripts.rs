//! The scripts the store runs, loaded once, and the key names of one pool.

use redis::Script;

pub(super) struct Scripts {
    pub(super) acquire: Script,
    pub(super) acquire_batch: Script,
    pub(super) confirm: Script,
    pub(super) cancel: Script,
    pub(super) expire: Script,
    pub(super) look: Script,
    pub(super) refill: Script,
    pub(super) take_for_return: Script,
    pub(super) untake: Script,
    pub(super) snapshot: Script,
    pub(super) stamps: Script,
    pub(super) reservation_state: Script,
    pub(super) idempotency_keys: Script,
    pub(super) fence: Script,
    pub(super) channel: Script,
    pub(super) basket: Script,
    pub(super) refund: Script,
    pub(super) extend: Script,
    pub(super) reservation: Script,
    pub(super) events: Script,
    pub(super) trim_events: Script,
    pub(super) moves: Script,
    /// `return 1` on a pool's key: what a script call costs Redis when it does nothing.
    pub(super) bare: Script,
}

/// A script that reads or writes a pool's structures: `lua/intact.lua` (whether the pool
/// still has all of them), `lua/codec.lua` (a reservation's record as stored) and
/// `lua/ids.lua` (where a record is, and its id) joined with the script's own text.
macro_rules! with_intact {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("../../../../lua/intact.lua"),
            include_str!("../../../../lua/codec.lua"),
            include_str!("../../../../lua/ids.lua"),
            wrapped!($name)
        ))
    };
}

/// A pool script's own text as the body of a function whose reply `lua/intact.lua`'s
/// `pool_reply` wraps as `{wseq, reply}` (raising the pool's write sequence if it wrote).
macro_rules! wrapped {
    ($name:literal) => {
        concat!(
            "local function pool_script()\n",
            include_str!(concat!("../../../../lua/", $name)),
            "\nend\nreturn pool_reply(pool_script())\n"
        )
    };
}

/// A script that changes reservation states: `lua/intact.lua`, `lua/codec.lua`,
/// `lua/ids.lua`, `lua/outbox.lua` (which writes the events), `lua/due.lua` (where
/// expiries are kept) and `lua/release.lua` (a reservation back to available) joined with
/// the script's own text.
macro_rules! with_outbox {
    ($name:literal) => {
        with_outbox!($name, "")
    };
    // `$before`: text between the preludes and the script's own (look.lua's `sweep`).
    ($name:literal, $($before:tt)+) => {
        Script::new(concat!(
            include_str!("../../../../lua/intact.lua"),
            include_str!("../../../../lua/codec.lua"),
            include_str!("../../../../lua/ids.lua"),
            include_str!("../../../../lua/outbox.lua"),
            include_str!("../../../../lua/due.lua"),
            include_str!("../../../../lua/release.lua"),
            $($before)+,
            wrapped!($name)
        ))
    };
}

/// An acquire script: `lua/intact.lua`, `lua/codec.lua`, `lua/ids.lua`, the outbox,
/// `lua/due.lua` and `lua/record.lua` (a new reservation's record, the replay and
/// partial-acquire rules) joined with the script's own text.
macro_rules! for_acquire {
    ($name:literal) => {
        Script::new(concat!(
            include_str!("../../../../lua/intact.lua"),
            include_str!("../../../../lua/codec.lua"),
            include_str!("../../../../lua/ids.lua"),
            include_str!("../../../../lua/outbox.lua"),
            include_str!("../../../../lua/due.lua"),
            include_str!("../../../../lua/record.lua"),
            wrapped!($name)
        ))
    };
}

impl Scripts {
    pub(super) fn load() -> Self {
        Self {
            acquire: for_acquire!("acquire.lua"),
            acquire_batch: for_acquire!("acquire_batch.lua"),
            confirm: with_outbox!("confirm.lua"),
            cancel: with_outbox!("cancel.lua"),
            expire: with_outbox!("expire.lua"),
            // expire.lua's sweep as a function, which look.lua calls before its read.
            look: with_outbox!(
                "look.lua",
                concat!("local function sweep()\n", include_str!("../../../../lua/expire.lua"), "\nend\n")
            ),
            refill: with_intact!("refill.lua"),
            take_for_return: with_intact!("take_for_return.lua"),
            untake: with_intact!("untake.lua"),
            snapshot: with_intact!("snapshot.lua"),
            stamps: Script::new(include_str!("../../../../lua/stamps.lua")),
            reservation_state: with_intact!("reservation_state.lua"),
            idempotency_keys: Script::new(concat!(
                include_str!("../../../../lua/codec.lua"),
                include_str!("../../../../lua/idempotency_keys.lua")
            )),
            fence: Script::new(include_str!("../../../../lua/fence.lua")),
            channel: Script::new(include_str!("../../../../lua/channel.lua")),
            basket: Script::new(include_str!("../../../../lua/basket.lua")),
            refund: with_outbox!("refund.lua"),
            extend: with_outbox!("extend.lua"),
            reservation: with_intact!("reservation.lua"),
            events: Script::new(include_str!("../../../../lua/events.lua")),
            trim_events: Script::new(include_str!("../../../../lua/trim_events.lua")),
            moves: Script::new(include_str!("../../../../lua/moves.lua")),
            bare: Script::new("return 1"),
        }
    }
}

/// The key names of one pool.
pub(super) struct Keys {
    pub(super) pool: String,
    pub(super) res: String,
    pub(super) due: String,
    pub(super) held: String,
    pub(super) idem: String,
    pub(super) gc: String,
    pub(super) grants: String,
    pub(super) takes: String,
    pub(super) fence: String,
    pub(super) outbox: String,
}

impl Keys {
    /// KEYS of `acquire.lua` and `acquire_batch.lua`: pool, res, due, held, idem, outbox,
    /// then the structures.
    pub(super) fn acquire_keys(&self) -> [&str; 14] {
        [
            &self.pool,
            &self.res,
            &self.due,
            &self.held,
            &self.idem,
            &self.outbox,
            &self.res,
            &self.due,
            &self.held,
            &self.idem,
            &self.gc,
            &self.grants,
            &self.takes,
            &self.outbox,
        ]
    }

    /// Appends the pool's eight structures to a script's KEYS, in the order
    /// `lua/intact.lua`'s `structures_from` reads them: every script that reads or writes
    /// a pool checks them all for their markers before anything else.
    pub(super) fn structures(&self, call: &mut redis::ScriptInvocation<'_>) {
        for key in [&self.res, &self.due, &self.held, &self.idem, &self.gc, &self.grants, &self.takes, &self.outbox] {
            call.key(key);
        }
    }
}
