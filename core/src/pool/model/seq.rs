//! A pool's write sequence: what tells a pool that went back in time from a live one.

use super::Pool;

impl Pool {
    /// The write sequence (see the field): what the store's caller keeps as its floor.
    pub fn write_seq(&self) -> u64 {
        self.write_seq
    }

    pub(super) fn wrote(&mut self) {
        self.write_seq = self.write_seq.saturating_add(1);
    }

    /// A pool found below `floor` ([`super::super::went_back`]) is a lost pool: it reads as one
    /// that does not exist, its reservations, keys and outbox dropped (grant and take
    /// records and the fence kept, as a store keeps them), its write sequence raised to the
    /// floor so the next generation continues above what was seen. `true` if it was behind.
    pub fn drop_if_behind(&mut self, floor: u64) -> bool {
        if !super::super::went_back(floor, self.write_seq) {
            return false;
        }
        *self = Pool {
            fence: self.fence,
            grants: std::mem::take(&mut self.grants),
            takes: std::mem::take(&mut self.takes),
            gc: std::mem::take(&mut self.gc),
            write_seq: floor,
            outbox_max: self.outbox_max,
            ..Pool::default()
        };
        true
    }
}
