//! The scripts behind refund, extend, the reservation lookup and the outbox reads.

use super::reply::{array, int, state, string, transition, uint, unexpected};
use super::*;
use crate::store::PoolEvent;

impl RedisPoolStore {
    pub(super) async fn refund_script(&self, pool: &PoolKey, reservation_id: &str) -> Result<Transition, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.refund.key(&k.pool);
        call.key(&k.res).key(&k.held).key(&k.outbox);
        k.structures(&mut call);
        call.arg(reservation_id).arg(self.outbox_max);
        entry.floor_arg(&mut call);
        let reply: Value = self.write(&k.pool, &call).await?;
        transition("refund", pool, entry.acknowledged(reply)?)
    }

    pub(super) async fn extend_script(
        &self,
        pool: &PoolKey,
        reservation_id: &str,
        extend_ms: u64,
        ttl_ms: u64,
    ) -> Result<ExtendResult, StoreError> {
        const WHAT: &str = "extend";
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.extend.key(&k.pool);
        call.key(&k.res).key(&k.due).key(&k.held).key(&k.gc).key(&k.outbox);
        k.structures(&mut call);
        call.arg(reservation_id).arg(extend_ms).arg(ttl_ms).arg(self.retention_ms).arg(self.outbox_max);
        entry.floor_arg(&mut call);
        let reply: Value = self.write(&k.pool, &call).await?;
        let items = array(WHAT, entry.acknowledged(reply)?)?;
        match items.as_slice() {
            [tag, at] if string(WHAT, tag)? == "extended" => {
                Ok(ExtendResult::Extended { expires_at_ms: int(WHAT, at)? })
            }
            [tag, s] if string(WHAT, tag)? == "refused" => Ok(ExtendResult::Refused(state(WHAT, &string(WHAT, s)?)?)),
            [tag] if string(WHAT, tag)? == "not_found" => Ok(ExtendResult::NotFound),
            [tag] if string(WHAT, tag)? == "lost" => Err(StoreError::PoolMissing(pool.hash_tag())),
            _ => Err(StoreError::Protocol(format!("{WHAT}: unexpected reply {items:?}"))),
        }
    }

    pub(super) async fn reservation_script(
        &self,
        pool: &PoolKey,
        by: &ReservationRef,
    ) -> Result<Option<(String, Reservation)>, StoreError> {
        const WHAT: &str = "reservation";
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.reservation.key(&k.res);
        call.key(&k.idem).key(&k.pool);
        k.structures(&mut call);
        match by {
            ReservationRef::Id(id) => call.arg("id").arg(id),
            ReservationRef::IdempotencyKey(key) => call.arg("key").arg(key),
        };
        entry.floor_arg(&mut call);
        let (_, reply) = super::batch::unwrap_seq(self.read(&call).await?)?;
        if reply == Value::Nil {
            return Ok(None);
        }
        if matches!(&reply, Value::BulkString(_) | Value::SimpleString(_)) && string(WHAT, &reply)? == "lost" {
            return Err(StoreError::PoolMissing(pool.hash_tag()));
        }
        let items = array(WHAT, reply)?;
        let [id, st, quantity, expires_at_ms, user_id, key, requested] = items.as_slice() else {
            return Err(StoreError::Protocol(format!("{WHAT}: unexpected reply {items:?}")));
        };
        let number = |v: &Value| string(WHAT, v)?.parse::<i64>().map_err(|_| unexpected(WHAT, v));
        Ok(Some((
            string(WHAT, id)?,
            Reservation {
                state: state(WHAT, &string(WHAT, st)?)?,
                quantity: u64::try_from(number(quantity)?).map_err(|_| unexpected(WHAT, quantity))?,
                expires_at_ms: number(expires_at_ms)?,
                user_id: string(WHAT, user_id)?,
                idempotency_key: string(WHAT, key)?,
                requested: u64::try_from(number(requested)?).map_err(|_| unexpected(WHAT, requested))?,
            },
        )))
    }

    /// A page of the outbox and its counters (`max` 0: the counters only).
    pub(super) async fn events_script(
        &self,
        pool: &PoolKey,
        from_sequence: u64,
        max: u64,
    ) -> Result<(EventPage, OutboxStats), StoreError> {
        const WHAT: &str = "events";
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.events.key(&k.pool);
        call.key(&k.outbox).arg(from_sequence).arg(max);
        let reply: Value = self.read(&call).await?;
        let items = array(WHAT, reply)?;
        let [generation, last, first_kept, kept, dropped, entries] = items.as_slice() else {
            return Err(StoreError::Protocol(format!("{WHAT}: unexpected reply {items:?}")));
        };
        let Value::Array(entries) = entries else { return Err(unexpected(WHAT, entries)) };
        let last_sequence = uint(WHAT, last)?;
        let page = EventPage {
            generation: uint(WHAT, generation)?,
            events: entries.iter().map(event).collect::<Result<_, _>>()?,
            last_sequence,
            first_kept: uint(WHAT, first_kept)?,
        };
        let stats = OutboxStats { kept: uint(WHAT, kept)?, dropped: uint(WHAT, dropped)?, last_sequence };
        Ok((page, stats))
    }

    pub(super) async fn trim_events_script(
        &self,
        pool: &PoolKey,
        generation: u64,
        through_sequence: u64,
    ) -> Result<u64, StoreError> {
        let entry = self.entry(pool);
        let k = &entry.keys;
        let mut call = self.shared.scripts.trim_events.key(&k.pool);
        call.key(&k.outbox).arg(through_sequence).arg(generation);
        // A trim lost in a failover only leaves events the relay sends again (deduplicated
        // by their ids downstream): no need to wait for replicas.
        let reply: Value = self.read(&call).await?;
        uint("trim_events", &reply)
    }
}

/// One XRANGE entry, `[id, [field, value, ...]]`, as written by `lua/outbox.lua`.
fn event(v: &Value) -> Result<PoolEvent, StoreError> {
    const WHAT: &str = "events";
    let Value::Array(parts) = v else { return Err(unexpected(WHAT, v)) };
    let [id, Value::Array(fields)] = parts.as_slice() else { return Err(unexpected(WHAT, v)) };
    let id = string(WHAT, id)?;
    let sequence = id.strip_suffix("-0").and_then(|s| s.parse::<u64>().ok()).ok_or_else(|| unexpected(WHAT, v))?;
    let mut e = PoolEvent {
        sequence,
        reservation_id: String::new(),
        idempotency_key: String::new(),
        user_id: String::new(),
        quantity: 0,
        state: ReservationState::Reserved,
        previous: None,
        at_ms: 0,
    };
    for pair in fields.chunks(2) {
        let [name, value] = pair else { return Err(unexpected(WHAT, v)) };
        let value = string(WHAT, value)?;
        let number = || value.parse::<i64>().map_err(|_| unexpected(WHAT, v));
        match string(WHAT, name)?.as_str() {
            "r" => e.reservation_id = value,
            "k" => e.idempotency_key = value,
            "u" => e.user_id = value,
            "q" => e.quantity = u64::try_from(number()?).map_err(|_| unexpected(WHAT, v))?,
            "s" => e.state = state(WHAT, &value)?,
            "p" if value.is_empty() => e.previous = None,
            "p" => e.previous = Some(state(WHAT, &value)?),
            "t" => e.at_ms = number()?,
            _ => {}
        }
    }
    Ok(e)
}
