//! Epochs that outlive the ledger. A channel's epoch fences its older incarnations twice:
//! the center refuses their calls, and each pool refuses their writes below its fence (the
//! highest epoch a registration fenced it with, kept in the pool store). A ledger that
//! went back in time (an asynchronous standby promoted, a backup restored) forgets
//! registrations, and its epoch counter goes back with them: it can hand out an epoch it
//! handed out before, one the pools are already fenced with or above.
//!
//! Such an epoch must not be used: below the fence the pools refuse the new incarnation's
//! writes while the center grants under it (units counted with the channel and shelved
//! nowhere); at the fence two incarnations share one epoch and neither fences the other.
//! So the registration's resync, which raises each pool's fence first, stops when the
//! fence it finds is at or above its epoch ([`reused`]) and writes nothing; the agent
//! registers again and shows the center the fence it found, and the center hands out an
//! epoch above it ([`epoch_above`]), which no incarnation has held.

/// Whether a registration answered `epoch` must register again: the pool's fence, as the
/// registration's own raise found it, is already at or above it (the ledger handed the
/// epoch out before it went back). A fence this registration raised is below its epoch.
pub fn reused(found_fence: u64, epoch: u64) -> bool {
    found_fence >= epoch
}

/// The epoch of a channel's next registration: above the last one the ledger knows
/// (`previous`, `None` for a channel it has never seen) and above `fenced_at`, the highest
/// pool fence the registering agent found (0: none).
pub fn epoch_above(previous: Option<u64>, fenced_at: u64) -> u64 {
    // The stored epoch is a signed 64-bit number: it never gets near u64::MAX.
    previous.unwrap_or(0).max(fenced_at).saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::ChannelSession;

    #[test]
    fn a_ledger_that_went_back_hands_out_an_epoch_above_the_fence_it_is_shown() {
        // Epochs 1..=7 were handed out and the pools fenced at 7; the restored ledger
        // remembers epoch 4 and hands out 5 again.
        let restored = ChannelSession::register(None, "a", 0, 1_000, 0);
        let restored = ChannelSession { epoch: 4, ..restored };
        let again = ChannelSession::register(Some(&restored), "a", 10, 1_000, 0);
        assert_eq!(again.epoch, 5);
        assert!(reused(7, again.epoch), "the pool was fenced above it");
        // The agent registers again showing the fence: the next epoch is above it.
        let next = ChannelSession::register(Some(&again), "a", 20, 1_000, 7);
        assert_eq!(next.epoch, 8);
        assert!(!reused(7, next.epoch));
        // At the fence is reused too: another incarnation held that epoch.
        assert!(reused(8, 8));
        // A fence below what the ledger knows changes nothing; nor does a new channel's 0.
        assert_eq!(epoch_above(Some(9), 3), 10);
        assert_eq!(epoch_above(None, 0), 1);
        assert_eq!(epoch_above(None, 6), 7);
        assert_eq!(epoch_above(Some(u64::MAX), 0), u64::MAX);
    }
}
