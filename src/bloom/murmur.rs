//! RedisBloom's item hashes, so that filters imported from it answer exactly
//! as it did: MurmurHash64A (its 64-bit scheme, every filter RedisBloom 2.x
//! creates) and the 32-bit MurmurHash2 (filters without its FORCE64 option).
//! Each scheme hashes twice — the second time seeded with the first hash —
//! and probes `(a + i·b) mod m`. The test vectors below were checked against
//! the bits RedisBloom 2.8.2 set.

const M64: u64 = 0xc6a4a7935bd1e995;
/// RedisBloom's seed for the first 64-bit hash (the multiplier itself).
const SEED64: u64 = 0xc6a4a7935bd1e995;
const M32: u32 = 0x5bd1e995;
const SEED32: u32 = 0x9747b28c;

/// Austin Appleby's MurmurHash64A (little-endian reads).
pub fn murmur64a(key: &[u8], seed: u64) -> u64 {
    const R: u32 = 47;
    let mut h = seed ^ (key.len() as u64).wrapping_mul(M64);
    let blocks = key.chunks_exact(8);
    let tail = blocks.remainder();
    for block in blocks {
        let mut k = u64::from_le_bytes(block.try_into().expect("8 bytes"));
        k = k.wrapping_mul(M64);
        k ^= k >> R;
        k = k.wrapping_mul(M64);
        h ^= k;
        h = h.wrapping_mul(M64);
    }
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u64::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M64);
    }
    h ^= h >> R;
    h = h.wrapping_mul(M64);
    h ^ (h >> R)
}

/// Austin Appleby's 32-bit MurmurHash2 (little-endian reads).
pub fn murmur2(key: &[u8], seed: u32) -> u32 {
    let mut h = seed ^ key.len() as u32;
    let blocks = key.chunks_exact(4);
    let tail = blocks.remainder();
    for block in blocks {
        let mut k = u32::from_le_bytes(block.try_into().expect("4 bytes"));
        k = k.wrapping_mul(M32);
        k ^= k >> 24;
        k = k.wrapping_mul(M32);
        h = h.wrapping_mul(M32) ^ k;
    }
    if !tail.is_empty() {
        for (i, &b) in tail.iter().enumerate() {
            h ^= u32::from(b) << (8 * i);
        }
        h = h.wrapping_mul(M32);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M32);
    h ^ (h >> 15)
}

/// RedisBloom's 64-bit hash pair of an item.
pub fn pair64(item: &[u8]) -> (u64, u64) {
    let a = murmur64a(item, SEED64);
    (a, murmur64a(item, a))
}

/// RedisBloom's 32-bit hash pair of an item.
pub fn pair32(item: &[u8]) -> (u64, u64) {
    let a = murmur2(item, SEED32);
    (u64::from(a), u64::from(murmur2(item, a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_match_redisbloom() {
        let cases: [(&[u8], u64, u64, u32, u32); 4] = [
            (
                b"",
                0x1ab11ea5a7b2c56e,
                0xbbddcb5ab56dd547,
                0x106e08d9,
                0x456d9087,
            ),
            (
                b"x",
                0x04bfc205e59fa416,
                0xb508ed921b0546a8,
                0x7e73e736,
                0xe0e9a063,
            ),
            (
                b"hello world",
                0xbae8fb35317acde1,
                0xa5c3078260d44436,
                0x48d0c363,
                0x76aefdba,
            ),
            (
                b"abcdefgh123",
                0xb94589dbfe319479,
                0x0468ee37b0b5d9c4,
                0x45f93b21,
                0x817d8590,
            ),
        ];
        for (item, a, b, a32, b32) in cases {
            assert_eq!(pair64(item), (a, b));
            assert_eq!(pair32(item), (u64::from(a32), u64::from(b32)));
        }
    }

    /// The bits RedisBloom 2.8.2 set for `x` in a 128-bit filter with 8 probes.
    #[test]
    fn probes_match_the_bits_redisbloom_set() {
        let probes = |(a, b): (u64, u64)| {
            let mut p: Vec<u64> = (0..8u64)
                .map(|i| a.wrapping_add(i.wrapping_mul(b)) % 128)
                .collect();
            p.sort_unstable();
            p
        };
        assert_eq!(probes(pair64(b"x")), [6, 14, 22, 46, 54, 62, 94, 102]);
        assert_eq!(probes(pair32(b"x")), [8, 25, 37, 54, 66, 95, 107, 124]);
        assert_eq!(
            probes(pair32(b"hello world")),
            [5, 17, 29, 63, 75, 87, 99, 121]
        );
    }
}
