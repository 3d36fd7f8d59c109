//! A scalable Bloom filter: a chain of sub-filters. When the newest one is
//! full, the next gets `capacity × expansion` and half the error rate, so the
//! chain's overall rate stays below the requested one.

use crate::bloom::filter::{bytes_for, hashes_for, Hash, Hashing, SubFilter, MAX_HASHES};
use crate::bloom::redisbloom;

/// Largest expansion accepted.
pub const MAX_EXPANSION: u32 = 32768;

/// How a filter is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Params {
    pub capacity: u64,
    pub error: f64,
    /// `None`: non-scaling.
    pub expansion: Option<u32>,
}

/// What a filter may take: `filter` bytes in all (`warden.bf-max-memory`),
/// and `room` more bytes at most (what the server's `maxmemory` leaves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    pub filter: u64,
    pub room: u64,
}

impl From<u64> for Limit {
    /// A filter limit alone: the server has room.
    fn from(filter: u64) -> Self {
        Self {
            filter,
            room: u64::MAX,
        }
    }
}

/// Why a filter cannot be created or grown.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// It would pass the memory limit.
    TooLarge,
    /// It needs this many more bytes than `maxmemory` leaves.
    NoRoom { need: u64 },
    /// The tightened error rate would reach zero (more than `MAX_HASHES` probes).
    ErrorTooSmall,
    /// A non-scaling filter is at capacity.
    Full,
    /// An imported filter cannot grow where RedisBloom's own growth fails.
    Failed,
}

/// Whose hashing and sizing a chain follows, for good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// warden's own (every filter created here).
    Warden,
    /// Imported from RedisBloom: its option bits, which say the hash width
    /// and whether new sub-filters are rounded to a power of two.
    RedisBloom { options: u32 },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Chain {
    pub filters: Vec<SubFilter>,
    /// `None`: non-scaling.
    pub expansion: Option<u32>,
    pub scheme: Scheme,
}

impl Chain {
    /// An empty filter, refused before allocation if it would pass `limit`.
    pub fn new(params: Params, limit: impl Into<Limit>) -> Result<Self, Refusal> {
        let error = Self::fits(params, limit)?;
        Ok(Self {
            filters: vec![SubFilter::new(params.capacity, error)],
            expansion: params.expansion,
            scheme: Scheme::Warden,
        })
    }

    /// Whether a filter of these parameters can be created under `max_bytes`
    /// (nothing is allocated); its first sub-filter's error rate if so.
    pub fn fits(params: Params, limit: impl Into<Limit>) -> Result<f64, Refusal> {
        // A scaling chain starts at p/2 so that p/2 + p/4 + ... stays below p.
        let error = match params.expansion {
            Some(_) => params.error / 2.0,
            None => params.error,
        };
        check(
            error,
            hashes_for(error),
            bytes_for(params.capacity, error),
            std::mem::size_of::<Self>() as u64,
            limit.into(),
        )?;
        Ok(error)
    }

    pub fn hashing(&self) -> Hashing {
        match self.scheme {
            Scheme::Warden => Hashing::Xxh3,
            Scheme::RedisBloom { options } => redisbloom::hashing(options),
        }
    }

    pub fn contains(&self, item: &[u8]) -> bool {
        let hash = Hash::with(self.hashing(), item);
        self.filters.iter().any(|f| f.contains(hash))
    }

    /// Adds an item: `Ok(true)` if new, `Ok(false)` if it may have existed.
    pub fn add(&mut self, item: &[u8], limit: impl Into<Limit>) -> Result<bool, Refusal> {
        let hash = Hash::with(self.hashing(), item);
        let (newest, older) = self
            .filters
            .split_last_mut()
            .expect("a chain has at least one sub-filter");
        if older.iter().any(|f| f.contains(hash)) {
            return Ok(false);
        }
        if !newest.is_full() {
            // Inserting tells whether the item was new: one pass over its bits.
            return Ok(newest.insert(hash));
        }
        if newest.contains(hash) {
            return Ok(false);
        }
        self.grow(limit.into())?;
        let newest = self.filters.len() - 1;
        Ok(self.filters[newest].insert(hash))
    }

    /// Whether the next new item needs a new sub-filter (and so the memory limit).
    pub fn is_full(&self) -> bool {
        self.newest().is_full()
    }

    fn newest(&self) -> &SubFilter {
        self.filters
            .last()
            .expect("a chain has at least one sub-filter")
    }

    fn grow(&mut self, limit: Limit) -> Result<(), Refusal> {
        let expansion = self.expansion.ok_or(Refusal::Full)?;
        let last = self.newest();
        let capacity = last
            .capacity
            .checked_mul(u64::from(expansion))
            .ok_or(Refusal::TooLarge)?;
        let error = last.error / 2.0;
        let used = self.bytes() as u64;
        let next = match self.scheme {
            Scheme::Warden => {
                let bytes = bytes_for(capacity, error);
                check(error, hashes_for(error), bytes, used, limit)?;
                SubFilter::new(capacity, error)
            }
            // RedisBloom's own growth, with its limits: it goes on while the
            // halved error rate is a positive double (past 64 probes).
            Scheme::RedisBloom { options } => {
                let shape = redisbloom::sized(capacity, error, options).ok_or(Refusal::Failed)?;
                let bytes = shape.words as f64 * 8.0 + std::mem::size_of::<SubFilter>() as f64;
                if error.is_nan()
                    || error <= 0.0
                    || u64::from(shape.hashes) > redisbloom::MAX_IMPORTED_HASHES
                {
                    return Err(Refusal::Failed);
                }
                check_size(bytes, used, limit)?;
                shape.empty()
            }
        };
        self.filters.push(next);
        Ok(())
    }

    /// Total capacity of all sub-filters.
    pub fn capacity(&self) -> u64 {
        self.filters.iter().map(|f| f.capacity).sum()
    }

    /// Items inserted.
    pub fn items(&self) -> u64 {
        self.filters.iter().map(|f| f.items).sum()
    }

    /// Memory used, in bytes.
    pub fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.filters.iter().map(SubFilter::bytes).sum::<usize>()
    }
}

/// Refuses a sub-filter (of `bytes`, with `hashes` probes) whose probes or
/// size would be out of bounds.
fn check(error: f64, hashes: u32, bytes: f64, used: u64, limit: Limit) -> Result<(), Refusal> {
    if error.is_nan() || error <= 0.0 || hashes > MAX_HASHES {
        return Err(Refusal::ErrorTooSmall);
    }
    check_size(bytes, used, limit)
}

/// Refuses `bytes` more on a filter of `used` bytes past either limit.
fn check_size(bytes: f64, used: u64, limit: Limit) -> Result<(), Refusal> {
    if used as f64 + bytes > limit.filter as f64 {
        return Err(Refusal::TooLarge);
    }
    if bytes > limit.room as f64 {
        return Err(Refusal::NoRoom {
            need: bytes.ceil() as u64,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = 128 << 20;

    fn scaling(capacity: u64, expansion: u32) -> Chain {
        Chain::new(
            Params {
                capacity,
                error: 0.01,
                expansion: Some(expansion),
            },
            MAX,
        )
        .unwrap()
    }

    #[test]
    fn scaling_chain_grows_by_expansion_with_halved_error() {
        let mut c = scaling(100, 2);
        for i in 0..1500 {
            c.add(format!("item-{i}").as_bytes(), MAX).unwrap();
        }
        let caps: Vec<u64> = c.filters.iter().map(|f| f.capacity).collect();
        assert_eq!(caps, [100, 200, 400, 800]);
        let errors: Vec<f64> = c.filters.iter().map(|f| f.error).collect();
        assert_eq!(errors, [0.005, 0.0025, 0.00125, 0.000625]);
        assert!(c.items() <= 1500 && c.items() > 1480);
    }

    #[test]
    fn non_scaling_filter_uses_the_error_itself_and_fills_up() {
        let mut c = Chain::new(
            Params {
                capacity: 10,
                error: 0.01,
                expansion: None,
            },
            MAX,
        )
        .unwrap();
        assert_eq!(c.filters[0].error, 0.01);
        let mut added = 0;
        let mut i = 0;
        while added < 10 {
            if c.add(format!("x{i}").as_bytes(), MAX).unwrap() {
                added += 1;
            }
            i += 1;
        }
        assert_eq!(c.add(b"one more", MAX), Err(Refusal::Full));
        assert_eq!(c.items(), 10);
    }

    #[test]
    fn existing_items_are_not_counted_again() {
        let mut c = scaling(100, 2);
        assert_eq!(c.add(b"a", MAX), Ok(true));
        assert_eq!(c.add(b"a", MAX), Ok(false));
        assert!(c.contains(b"a"));
        assert!(!c.contains(b"b"));
        assert_eq!(c.items(), 1);
    }

    #[test]
    fn huge_reservations_are_refused_before_allocating() {
        let p = Params {
            capacity: 1 << 50,
            error: 0.001,
            expansion: Some(2),
        };
        assert_eq!(Chain::new(p, MAX), Err(Refusal::TooLarge));
        let p = Params {
            capacity: u64::MAX,
            error: 1e-19,
            expansion: None,
        };
        assert_eq!(Chain::new(p, u64::MAX), Err(Refusal::TooLarge));
    }

    #[test]
    fn tiny_error_rates_are_refused() {
        let p = Params {
            capacity: 10,
            error: 1e-30,
            expansion: None,
        };
        assert_eq!(Chain::new(p, MAX), Err(Refusal::ErrorTooSmall));
    }

    #[test]
    fn long_scaling_stops_at_the_error_floor_not_in_a_crash() {
        let mut c = scaling(1, 1);
        let mut refused = None;
        for i in 0..10_000u32 {
            if let Err(r) = c.add(&i.to_le_bytes(), MAX) {
                refused = Some(r);
                break;
            }
        }
        assert_eq!(refused, Some(Refusal::ErrorTooSmall));
        assert!(c.filters.len() < 70);
    }

    #[test]
    fn scale_out_past_the_memory_limit_is_refused() {
        let limit = 4096;
        let mut c = Chain::new(
            Params {
                capacity: 100,
                error: 0.01,
                expansion: Some(4),
            },
            limit,
        )
        .unwrap();
        let mut refused = None;
        for i in 0..100_000u32 {
            if let Err(r) = c.add(&i.to_le_bytes(), limit) {
                refused = Some(r);
                break;
            }
        }
        assert_eq!(refused, Some(Refusal::TooLarge));
        assert!(c.bytes() as u64 <= limit);
    }

    #[test]
    fn what_maxmemory_leaves_bounds_creation_and_scale_out() {
        let p = Params {
            capacity: 1000,
            error: 0.01,
            expansion: Some(2),
        };
        let tight = Limit {
            filter: MAX,
            room: 100,
        };
        assert!(matches!(Chain::new(p, tight), Err(Refusal::NoRoom { need }) if need > 100));
        let mut c = Chain::new(p, MAX).unwrap();
        let mut refused = None;
        for i in 0..5_000u32 {
            if let Err(r) = c.add(&i.to_le_bytes(), tight) {
                refused = Some(r);
                break;
            }
        }
        assert!(matches!(refused, Some(Refusal::NoRoom { .. })));
        assert_eq!(c.filters.len(), 1);
    }

    #[test]
    fn chain_false_positive_rate_stays_below_p_after_scaling() {
        let mut c = scaling(1000, 2);
        for i in 0..15_000 {
            c.add(format!("in-{i}").as_bytes(), MAX).unwrap();
        }
        let trials = 100_000;
        let fp = (0..trials)
            .filter(|i| c.contains(format!("out-{i}").as_bytes()))
            .count();
        assert!((fp as f64 / trials as f64) <= 0.01, "{fp}");
    }
}
