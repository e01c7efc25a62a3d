//! Parsing the scripts' replies into the store's types.

use super::*;
pub(super) fn unexpected(what: &str, v: &Value) -> StoreError {
    StoreError::Protocol(format!("{what}: unexpected reply {v:?}"))
}

pub(super) fn array(what: &str, v: Value) -> Result<Vec<Value>, StoreError> {
    match v {
        Value::Array(items) => Ok(items),
        other => Err(unexpected(what, &other)),
    }
}

pub(super) fn string(what: &str, v: &Value) -> Result<String, StoreError> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).map_err(|_| unexpected(what, v)),
        Value::SimpleString(s) => Ok(s.clone()),
        other => Err(unexpected(what, other)),
    }
}

pub(super) fn int(what: &str, v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(unexpected(what, other)),
    }
}

pub(super) fn uint(what: &str, v: &Value) -> Result<u64, StoreError> {
    u64::try_from(int(what, v)?).map_err(|_| unexpected(what, v))
}

pub(super) fn state(what: &str, s: &str) -> Result<ReservationState, StoreError> {
    ReservationState::parse(s).ok_or_else(|| StoreError::Protocol(format!("{what}: unknown reservation state {s:?}")))
}

/// Parses `{verdict, state}` from confirm.lua, cancel.lua and refund.lua; `{'lost'}`: the
/// pool lost its data (nothing was written).
pub(super) fn transition(what: &str, pool: &PoolKey, v: Value) -> Result<Transition, StoreError> {
    let items = array(what, v)?;
    let verdict = items.first().map(|v| string(what, v)).transpose()?;
    if verdict.as_deref() == Some("lost") {
        return Err(StoreError::PoolMissing(pool.hash_tag()));
    }
    let st = items.get(1).map(|v| string(what, v)).transpose()?;
    match (verdict.as_deref(), st.as_deref()) {
        (Some("done"), Some(s)) => Ok(Transition::Done(state(what, s)?)),
        (Some("refused"), Some(s)) => Ok(Transition::Refused(state(what, s)?)),
        (Some("not_found"), _) => Ok(Transition::NotFound),
        _ => Err(StoreError::Protocol(format!("{what}: unexpected reply {items:?}"))),
    }
}

pub(super) fn acquire_result(v: Value, pool: &PoolKey, new_reservation_id: &str) -> Result<AcquireResult, StoreError> {
    const WHAT: &str = "acquire";
    let items = array(WHAT, v)?;
    let Some(tag) = items.first() else { return Err(StoreError::Protocol("acquire: empty reply".to_owned())) };
    let field = |i: usize| items.get(i).ok_or_else(|| StoreError::Protocol(format!("acquire: short reply {items:?}")));
    match string(WHAT, tag)?.as_str() {
        "reserved" => Ok(AcquireResult::Reserved {
            reservation_id: string(WHAT, field(1)?)?,
            quantity: uint(WHAT, field(2)?)?,
            expires_at_ms: int(WHAT, field(3)?)?,
            replayed: int(WHAT, field(4)?)? == 1,
            generation: uint(WHAT, field(5)?)?,
        }),
        "sold_out" => Ok(AcquireResult::SoldOut { available: uint(WHAT, field(1)?)? }),
        "limit" => Ok(AcquireResult::LimitExceeded { held: uint(WHAT, field(1)?)? }),
        "conflict" => Ok(AcquireResult::KeyConflict),
        "duplicate_id" => Err(crate::store::memory::duplicate_reservation_id(new_reservation_id)),
        "generation" => {
            let number = |v: &Value| string(WHAT, v)?.parse::<u64>().map_err(|_| unexpected(WHAT, v));
            Err(StoreError::GenerationChanged {
                pool: pool.hash_tag(),
                expected: number(field(1)?)?,
                actual: number(field(2)?)?,
            })
        }
        _ => Err(StoreError::Protocol(format!("acquire: unexpected reply {items:?}"))),
    }
}
