//! What this process is doing for its channel: whether it leads the channel's replicas
//! (only the leader talks to the center about stock) and whether it drains.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub struct Role {
    leading: AtomicBool,
    draining: AtomicBool,
}

impl Role {
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Acquire)
    }

    pub(crate) fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::Release);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
}
