//! One Bloom filter: a bit array sized for a capacity and an error rate,
//! probed k times by double hashing of one 128-bit xxh3 hash (or, for
//! filters imported from RedisBloom, of its MurmurHash pair).

use bitvec::prelude::*;
use xxhash_rust::xxh3::xxh3_128;

use crate::bloom::murmur;

/// Most probes a sub-filter may use: an error rate of 2^-64 (about 5e-20).
pub const MAX_HASHES: u32 = 64;

/// How a filter turns an item into probes. Recorded per filter: an imported
/// filter keeps RedisBloom's scheme for good, so its answers never change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hashing {
    /// warden's own: xxh3-128, reduced by multiply-shift.
    Xxh3,
    /// RedisBloom's 64-bit scheme: MurmurHash64A, probes `(a + i·b) mod m`.
    Murmur64,
    /// RedisBloom's older 32-bit scheme: MurmurHash2, the same probes.
    Murmur32,
}

/// The two 64-bit halves of an item's hash.
#[derive(Clone, Copy, Debug)]
pub struct Hash {
    h1: u64,
    h2: u64,
    modulo: bool,
}

impl Hash {
    #[cfg(test)]
    pub fn of(item: &[u8]) -> Self {
        Self::with(Hashing::Xxh3, item)
    }

    pub fn with(hashing: Hashing, item: &[u8]) -> Self {
        match hashing {
            Hashing::Xxh3 => {
                let h = xxh3_128(item);
                Self {
                    h1: h as u64,
                    h2: (h >> 64) as u64 | 1,
                    modulo: false,
                }
            }
            Hashing::Murmur64 => {
                let (h1, h2) = murmur::pair64(item);
                Self {
                    h1,
                    h2,
                    modulo: true,
                }
            }
            Hashing::Murmur32 => {
                let (h1, h2) = murmur::pair32(item);
                Self {
                    h1,
                    h2,
                    modulo: true,
                }
            }
        }
    }

    /// The i-th probe in `[0, m)`: double hashing, reduced by a
    /// multiply-shift instead of a modulo (no division, no modulo bias) —
    /// or by RedisBloom's plain modulo for its schemes.
    fn probe(self, i: u32, m: u64) -> usize {
        let x = self.h1.wrapping_add(u64::from(i).wrapping_mul(self.h2));
        if self.modulo {
            (x % m) as usize
        } else {
            ((u128::from(x) * u128::from(m)) >> 64) as usize
        }
    }
}

/// ln 2 as RedisBloom's sizing writes it (15 significant digits). With the
/// same constant and the same order of operations, every filter gets the
/// same bits and probes as in RedisBloom, to the last bit (`BF.DEBUG` shows
/// them); the exact `ln 2` differs at error rates that are powers of two.
#[allow(clippy::approx_constant)] // deliberately RedisBloom's value, not the exact one
const LN_2: f64 = 0.693147180559945;

/// Bits per item for error rate `error`: `-ln p / ln² 2`.
fn bits_per_item(error: f64) -> f64 {
    -(error.ln() / (LN_2 * LN_2))
}

/// Probes for error rate `error`: `ceil(ln 2 · bits per item)`, about
/// `ceil(-log2 error)`.
pub fn hashes_for(error: f64) -> u32 {
    (LN_2 * bits_per_item(error)).ceil().max(1.0) as u32
}

/// 64-bit words for `capacity` items at `error`: `n · bits per item` bits
/// (whole bits), rounded up to whole words. A float, so absurd sizes can be
/// refused before anything is allocated.
pub fn words_for(capacity: u64, error: f64) -> f64 {
    let bits = (capacity as f64 * bits_per_item(error)).trunc();
    (bits / 64.0).ceil().max(1.0)
}

/// How filters were sized before they matched RedisBloom's: `ceil(-log2 p)`
/// probes and `ceil(-n ln p / ln² 2)` bits. Filters saved then keep their
/// sizes and probes when they are loaded.
pub mod earlier {
    use std::f64::consts::LN_2;

    pub fn hashes_for(error: f64) -> u32 {
        (-error.log2()).ceil().max(1.0) as u32
    }

    pub fn words_for(capacity: u64, error: f64) -> f64 {
        let bits = (-(capacity as f64) * error.ln() / (LN_2 * LN_2)).ceil();
        (bits / 64.0).ceil().max(1.0)
    }
}

/// Bytes a sub-filter of these parameters needs (bits plus bookkeeping).
pub fn bytes_for(capacity: u64, error: f64) -> f64 {
    words_for(capacity, error) * 8.0 + std::mem::size_of::<SubFilter>() as f64
}

/// A fixed-size Bloom filter.
#[derive(Clone, Debug, PartialEq)]
pub struct SubFilter {
    pub bits: BitVec<u64, Lsb0>,
    pub capacity: u64,
    pub error: f64,
    pub hashes: u32,
    /// Items added (counted only when an add set a new bit).
    pub items: u64,
    /// Probes go modulo `2^n2` when non-zero (RedisBloom's power-of-two
    /// filters), else modulo the bit count.
    pub n2: u8,
}

impl SubFilter {
    /// An empty filter; the caller has checked `bytes_for` against its limit.
    pub fn new(capacity: u64, error: f64) -> Self {
        let words = words_for(capacity, error) as usize;
        // Zeroed memory straight from the allocator (calloc inside Redis):
        // no page is touched until a bit is set.
        Self::from_words(vec![0; words], capacity, error, hashes_for(error), 0)
    }

    /// A filter over existing words (decoding), with the probes it was built with.
    pub fn from_words(words: Vec<u64>, capacity: u64, error: f64, hashes: u32, items: u64) -> Self {
        Self {
            bits: BitVec::from_vec(words),
            capacity,
            error,
            hashes,
            items,
            n2: 0,
        }
    }

    /// What probes are reduced modulo.
    fn modulus(&self) -> u64 {
        match self.n2 {
            0 => self.bits.len() as u64,
            n => 1 << n,
        }
    }

    pub fn words(&self) -> &[u64] {
        self.bits.as_raw_slice()
    }

    pub fn words_mut(&mut self) -> &mut [u64] {
        self.bits.as_raw_mut_slice()
    }

    pub fn is_full(&self) -> bool {
        self.items >= self.capacity
    }

    pub fn bytes(&self) -> usize {
        self.bits.as_raw_slice().len() * 8 + std::mem::size_of::<Self>()
    }

    pub fn contains(&self, hash: Hash) -> bool {
        let m = self.modulus();
        (0..self.hashes).all(|i| self.bits[hash.probe(i, m)])
    }

    /// Sets the item's bits; true if any was newly set (the item is new).
    pub fn insert(&mut self, hash: Hash) -> bool {
        let m = self.modulus();
        let mut fresh = false;
        for i in 0..self.hashes {
            let mut bit = self
                .bits
                .get_mut(hash.probe(i, m))
                .expect("probe below bit count");
            fresh |= !*bit;
            *bit = true;
        }
        if fresh {
            self.items += 1;
        }
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizing_follows_the_formula_in_whole_words() {
        // n = 1000, p = 0.01: 9586 bits -> 150 words
        assert_eq!(words_for(1000, 0.01), 150.0);
        assert_eq!(hashes_for(0.01), 7);
        assert_eq!(hashes_for(0.001), 10);
        assert_eq!(hashes_for(0.5), 2);
        assert_eq!(hashes_for(0.25), 3);
        assert_eq!(words_for(1, 0.5), 1.0);
        // RedisBloom keeps whole bits: 128.78 bits are 2 words, not 3.
        assert_eq!(words_for(1000, 0.94), 2.0);
        assert_eq!(words_for(50000, 0.0005), 12360.0);
        assert_eq!(hashes_for(0.0005), 11);
    }

    #[test]
    fn earlier_sizing_differs_only_at_the_edges() {
        assert_eq!(earlier::hashes_for(0.5), 1);
        assert_eq!(earlier::words_for(1000, 0.94), 3.0);
        assert_eq!(earlier::hashes_for(0.01), hashes_for(0.01));
        assert_eq!(earlier::words_for(1000, 0.01), words_for(1000, 0.01));
    }

    #[test]
    fn probes_stay_in_range() {
        for m in [1u64, 63, 64, 1000, u64::from(u32::MAX) + 7] {
            for item in 0..200u32 {
                let h = Hash::of(&item.to_le_bytes());
                for i in 0..MAX_HASHES {
                    assert!((h.probe(i, m) as u64) < m);
                }
            }
        }
    }

    #[test]
    fn added_items_are_found_and_counted_once() {
        let mut f = SubFilter::new(100, 0.01);
        assert!(f.insert(Hash::of(b"a")));
        assert!(!f.insert(Hash::of(b"a")));
        assert!(f.contains(Hash::of(b"a")));
        assert_eq!(f.items, 1);
    }

    /// The measured rate of a filter holding `n` items, over `trials` absent items.
    fn measured_rate(n: u64, p: f64, trials: u64) -> f64 {
        let mut f = SubFilter::new(n, p);
        for i in 0..n {
            f.insert(Hash::of(format!("in-{i}").as_bytes()));
        }
        let fp = (0..trials)
            .filter(|i| f.contains(Hash::of(format!("out-{i}").as_bytes())))
            .count();
        fp as f64 / trials as f64
    }

    /// The formulas (m from p, k = ceil(-log2 p)) give a theoretical rate of
    /// (1 - e^(-kn/m))^k at capacity: 1.004·p at p = 0.01, 1.02·p at p = 0.001.
    /// The hashing must not add more than sampling noise to that.
    #[test]
    fn false_positive_rate_at_capacity_matches_theory() {
        for p in [0.01, 0.001] {
            let n = 20_000u64;
            let m = words_for(n, p) * 64.0;
            let k = f64::from(hashes_for(p));
            let theory = (1.0 - (-k * n as f64 / m).exp()).powf(k);
            let rate = measured_rate(n, p, 400_000);
            assert!(
                rate <= theory * 1.15,
                "p={p}: measured {rate}, theory {theory}"
            );
        }
    }
}
