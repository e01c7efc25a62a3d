//! A tiny deterministic PRNG (SplitMix64). The whole simulation draws from one of these,
//! seeded by the run's seed, so a seed names one exact run on every machine.

/// SplitMix64 (Steele, Lea, Flood 2014): 64 bits of state, good enough statistics for
/// picking events, and no dependency whose output could change between versions.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0)");
        // Lemire's multiply-shift; the tiny bias is irrelevant here.
        u64::try_from((u128::from(self.next_u64()) * u128::from(n)) >> 64).expect("the high half of a u128 fits in u64")
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u32) -> bool {
        self.below(100) < u64::from(percent)
    }

    /// An index into a slice of length `len` (positive).
    pub fn index(&mut self, len: usize) -> usize {
        usize::try_from(self.below(u64::try_from(len).expect("a length fits in u64"))).expect("below len")
    }

    /// An index chosen with the given weights (at least one positive).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        let mut pick = self.below(total);
        for (i, w) in weights.iter().enumerate() {
            if pick < u64::from(*w) {
                return i;
            }
            pick -= u64::from(*w);
        }
        unreachable!("pick < total")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::new(7).next_u64(), Rng::new(8).next_u64());
    }

    #[test]
    fn ranges_stay_in_bounds() {
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert!(r.below(3) < 3);
            assert!((5..=9).contains(&r.range(5, 9)));
            assert_eq!(r.weighted(&[0, 4, 0]), 1);
        }
    }
}
