//! Who buys next: a user population of a given size with a chosen skew. Pure: the caller
//! brings the random number generator, so tests and runs are reproducible from a seed.

use std::fmt;
use std::str::FromStr;

use rand::Rng;

/// Largest population a Zipf sampler tabulates (8 bytes of table per user).
pub const MAX_ZIPF_USERS: u64 = 10_000_000;

/// How requests spread over the users.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Skew {
    /// Every user equally likely.
    Uniform,
    /// The user of rank r (1-based) is chosen with probability proportional to 1/r^s.
    Zipf { s: f64 },
    /// A hot set: `share` of the requests come from the first `fraction` of the users,
    /// the rest uniformly from everyone else.
    Hot { fraction: f64, share: f64 },
}

impl FromStr for Skew {
    type Err = String;

    /// `uniform`, `zipf` (s = 1), `zipf:S`, `hot:FRACTION:SHARE` (e.g. `hot:0.01:0.9`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(':').collect();
        let num =
            |v: &str, what: &str| v.parse::<f64>().map_err(|_| format!("skew {s:?}: {what} {v:?} is not a number"));
        match parts.as_slice() {
            ["uniform"] => Ok(Skew::Uniform),
            ["zipf"] => Ok(Skew::Zipf { s: 1.0 }),
            ["zipf", e] => {
                let e = num(e, "exponent")?;
                if !(e.is_finite() && e >= 0.0) {
                    return Err(format!("skew {s:?}: exponent must be a finite number >= 0"));
                }
                Ok(Skew::Zipf { s: e })
            }
            ["hot", f, p] => {
                let (fraction, share) = (num(f, "fraction")?, num(p, "share")?);
                if !(fraction > 0.0 && fraction <= 1.0 && (0.0..=1.0).contains(&share)) {
                    return Err(format!("skew {s:?}: fraction must be in (0, 1] and share in [0, 1]"));
                }
                Ok(Skew::Hot { fraction, share })
            }
            _ => Err(format!("skew {s:?}: expected uniform, zipf, zipf:S or hot:FRACTION:SHARE")),
        }
    }
}

impl fmt::Display for Skew {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skew::Uniform => write!(f, "uniform"),
            Skew::Zipf { s } => write!(f, "zipf:{s}"),
            Skew::Hot { fraction, share } => write!(f, "hot:{fraction}:{share}"),
        }
    }
}

/// Draws user indexes in `0..users` following a [`Skew`]. Index 0 is the hottest user.
#[derive(Debug, Clone)]
pub struct UserSampler {
    users: u64,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Uniform,
    /// Cumulative weights of ranks 1..=users; a uniform draw in [0, last) is looked up.
    Cdf(Vec<f64>),
    Hot {
        hot_users: u64,
        share: f64,
    },
}

impl UserSampler {
    pub fn new(users: u64, skew: Skew) -> Result<Self, String> {
        if users == 0 {
            return Err("users must be at least 1".to_owned());
        }
        let kind = match skew {
            Skew::Uniform => Kind::Uniform,
            Skew::Zipf { s } => {
                if users > MAX_ZIPF_USERS {
                    return Err(format!("a zipf population holds at most {MAX_ZIPF_USERS} users, not {users}"));
                }
                let mut total = 0.0;
                let cdf = (1..=users)
                    .map(|rank| {
                        total += (rank as f64).powf(-s);
                        total
                    })
                    .collect();
                Kind::Cdf(cdf)
            }
            Skew::Hot { fraction, share } => {
                let hot_users = crate::stats::round_to_u64(users as f64 * fraction).clamp(1, users);
                Kind::Hot { hot_users, share }
            }
        };
        Ok(Self { users, kind })
    }

    #[cfg(test)]
    pub fn users(&self) -> u64 {
        self.users
    }

    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        match &self.kind {
            Kind::Uniform => rng.random_range(0..self.users),
            Kind::Cdf(cdf) => {
                let last = cdf.last().copied().unwrap_or(1.0);
                let u = rng.random::<f64>() * last;
                (cdf.partition_point(|&c| c <= u) as u64).min(self.users - 1)
            }
            Kind::Hot { hot_users, share } => {
                let cold = self.users - hot_users;
                if cold == 0 || rng.random_bool(*share) {
                    rng.random_range(0..*hot_users)
                } else {
                    hot_users + rng.random_range(0..cold)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    use super::*;

    fn counts(sampler: &UserSampler, draws: usize) -> Vec<u64> {
        let mut rng = SmallRng::seed_from_u64(7);
        let mut counts = vec![0u64; usize::try_from(sampler.users()).expect("users fit in memory")];
        for _ in 0..draws {
            counts[usize::try_from(sampler.sample(&mut rng)).expect("a user index")] += 1;
        }
        counts
    }

    #[test]
    fn parses_and_prints_skews() {
        assert_eq!("uniform".parse::<Skew>(), Ok(Skew::Uniform));
        assert_eq!("zipf".parse::<Skew>(), Ok(Skew::Zipf { s: 1.0 }));
        assert_eq!("zipf:0.8".parse::<Skew>(), Ok(Skew::Zipf { s: 0.8 }));
        assert_eq!("hot:0.01:0.9".parse::<Skew>(), Ok(Skew::Hot { fraction: 0.01, share: 0.9 }));
        for bad in ["", "zipf:x", "zipf:-1", "hot:0:0.5", "hot:0.1:2", "pareto"] {
            assert!(bad.parse::<Skew>().is_err(), "{bad:?} should not parse");
        }
        assert_eq!(Skew::Hot { fraction: 0.01, share: 0.9 }.to_string(), "hot:0.01:0.9");
    }

    #[test]
    fn zipf_follows_one_over_rank() {
        // s = 1 over 1,000 users: rank 1 has probability 1/H(1000) ~ 0.1336, rank 2 half that.
        let sampler = UserSampler::new(1_000, Skew::Zipf { s: 1.0 }).unwrap();
        let draws = 200_000;
        let c = counts(&sampler, draws);
        let h: f64 = (1..=1_000).map(|r| 1.0 / r as f64).sum();
        let p1 = c[0] as f64 / draws as f64;
        assert!((p1 - 1.0 / h).abs() < 0.005, "rank 1 share {p1}");
        let ratio = c[0] as f64 / c[1] as f64;
        assert!((ratio - 2.0).abs() < 0.1, "rank 1 / rank 2 = {ratio}");
        assert!(c[999] > 0, "the coldest user is still drawn sometimes");
    }

    #[test]
    fn zipf_zero_is_uniform_and_samples_stay_in_range() {
        let sampler = UserSampler::new(10, Skew::Zipf { s: 0.0 }).unwrap();
        let c = counts(&sampler, 100_000);
        assert!(c.iter().all(|&n| (9_000..11_000).contains(&n)), "{c:?}");
        let uniform = UserSampler::new(3, Skew::Uniform).unwrap();
        assert_eq!(counts(&uniform, 1_000).len(), 3);
        assert!(UserSampler::new(0, Skew::Uniform).is_err());
        assert!(UserSampler::new(MAX_ZIPF_USERS + 1, Skew::Zipf { s: 1.0 }).is_err());
    }

    #[test]
    fn hot_set_gets_its_share() {
        let sampler = UserSampler::new(10_000, Skew::Hot { fraction: 0.01, share: 0.9 }).unwrap();
        let draws = 100_000;
        let c = counts(&sampler, draws);
        let hot: u64 = c[..100].iter().sum();
        let share = hot as f64 / draws as f64;
        // 90% from the hot set, plus the cold draws never land there.
        assert!((share - 0.9).abs() < 0.01, "hot share {share}");
    }
}
