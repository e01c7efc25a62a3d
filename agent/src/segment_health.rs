//! What the driver remembers of a segmented item's pools between reads: which segments
//! the store lost ([`SegmentHealth`]), and one generation for many ([`digest`]). Below
//! `items` (which keeps a [`SegmentHealth`] per item) and `segmented` (which reads and
//! moves the segments).

/// Which segments of an item the store lost, as the leading replica's reads found them:
/// a segment is lost when its generation differs from the one first seen (it vanished, or
/// came back as another pool). Cleared only when the agent creates the segment again
/// ([`SegmentHealth::reopened`]), after the rules settled the loss with the center.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SegmentHealth {
    known: Vec<u64>,
    lost: Vec<bool>,
}

impl SegmentHealth {
    /// Takes in the segments' generations as just read; true when some are lost.
    pub fn observe(&mut self, generations: &[u64]) -> bool {
        self.known.resize(generations.len(), 0);
        self.lost.resize(generations.len(), false);
        for (i, &g) in generations.iter().enumerate() {
            if self.known[i] == 0 {
                self.known[i] = g;
            } else if g != self.known[i] {
                self.lost[i] = true;
            }
        }
        self.any_lost()
    }

    pub fn any_lost(&self) -> bool {
        self.lost.contains(&true)
    }

    /// Every segment lost: the item's pool is lost as a whole.
    pub fn all_lost(&self) -> bool {
        !self.lost.is_empty() && self.lost.iter().all(|l| *l)
    }

    pub fn is_lost(&self, segment: u32) -> bool {
        self.lost.get(segment as usize).copied().unwrap_or(false)
    }

    /// The lost segments' numbers.
    pub fn lost(&self) -> Vec<u32> {
        (0u32..).zip(&self.lost).filter(|(_, l)| **l).map(|(s, _)| s).collect()
    }

    /// The generations the rules see while some segments are lost: the known ones, so the
    /// rules see the same pool (the loss is the driver's to tell, as a part).
    pub fn known_digest(&self) -> u64 {
        digest(self.known.iter().copied())
    }

    /// Every lost segment was created again: learn their generations afresh.
    pub fn reopened(&mut self) {
        for (known, lost) in self.known.iter_mut().zip(self.lost.iter_mut()) {
            if *lost {
                *known = 0;
                *lost = false;
            }
        }
    }
}

/// One generation for the segments: 0 when any is missing (the item's pool is then not
/// whole, and the rules treat it as vanished), else an FNV-1a digest of theirs, nonzero
/// and below 2^53 like a pool's own. A single segment keeps its generation.
pub fn digest(generations: impl IntoIterator<Item = u64>) -> u64 {
    let gens: Vec<u64> = generations.into_iter().collect();
    if gens.len() == 1 {
        return gens[0];
    }
    if gens.is_empty() || gens.contains(&0) {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for g in gens {
        for b in g.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    (h & ((1 << 53) - 1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_is_lost_when_its_generation_changes_until_reopened() {
        let mut h = SegmentHealth::default();
        assert!(!h.observe(&[0, 0, 0]), "not created yet");
        assert!(!h.observe(&[5, 6, 7]), "first seen");
        let before = h.known_digest();
        assert!(h.observe(&[5, 0, 7]), "vanished");
        assert!(h.observe(&[5, 9, 7]), "came back as another pool: still lost");
        assert_eq!((h.lost(), h.all_lost(), h.is_lost(1), h.is_lost(9)), (vec![1], false, true, false));
        assert_eq!(h.known_digest(), before, "the rules keep seeing the known pool");
        h.reopened();
        assert!(!h.observe(&[5, 11, 7]), "the new generation learned");
        assert!(h.observe(&[0, 11, 0]) && !h.all_lost());
        assert!(h.observe(&[0, 0, 0]) && h.all_lost());
    }

    #[test]
    fn digest_sees_any_segment_change() {
        assert_eq!(digest([42]), 42);
        assert_eq!(digest([1, 0, 3]), 0);
        let a = digest([1, 2, 3]);
        assert_ne!(a, 0);
        assert!(a < 1 << 53);
        assert_eq!(a, digest([1, 2, 3]));
        assert_ne!(a, digest([1, 2, 4]));
    }
}
