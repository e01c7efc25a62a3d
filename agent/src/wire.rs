//! The store's reservation types as the wire's messages: one mapping, shared by the
//! reservation calls, the event feed and the gRPC edge.

use inventory_proto::v1 as pb;

use crate::store::{Reservation, ReservationState};

pub fn reservation_state_pb(s: ReservationState) -> i32 {
    let s = match s {
        ReservationState::Reserved => pb::ReservationState::Reserved,
        ReservationState::Confirmed => pb::ReservationState::Confirmed,
        ReservationState::Cancelled => pb::ReservationState::Cancelled,
        ReservationState::Expired => pb::ReservationState::Expired,
        ReservationState::Refunded => pb::ReservationState::Refunded,
    };
    s as i32
}

pub fn reservation_pb(id: String, r: Reservation, pool_generation: u64) -> pb::Reservation {
    pb::Reservation {
        reservation_id: id,
        idempotency_key: r.idempotency_key,
        user_id: r.user_id,
        quantity: r.quantity,
        state: reservation_state_pb(r.state),
        expires_at_unix_ms: r.expires_at_ms,
        pool_generation,
    }
}
