//! RedisBloom 2.x's Bloom filter formats, read and written so that its
//! filters move over unchanged (and could move back). The layouts, as
//! RedisBloom's `rebloom.c`/`sb.c` write them (`SBChain` of `SBLink`s, each a
//! `struct bloom`), confirmed byte by byte against RedisBloom 2.8.2:
//!
//! - RDB, type `MBbloom--`, encoding versions 1–4 (2.x writes 4): unsigned
//!   items, unsigned links, [≥ 2] unsigned options, [≥ 4] unsigned growth
//!   (else 2); per link: unsigned capacity (`entries`), double error,
//!   unsigned hashes, double bits per entry, unsigned bits, unsigned `n2`,
//!   the bit array as a string, unsigned items of the link.
//! - `SCANDUMP` header, packed little-endian: u64 items, u32 links, u32
//!   options, u32 growth; per link u64 bytes, u64 bits, u64 items, f64 error,
//!   f64 bits per entry, u32 hashes, u64 capacity, u8 `n2`. Then the links'
//!   bit arrays, one after another, in chunks that stay inside one link.
//!
//! Bit `x` of a link is bit `x % 8` of byte `x / 8`: the little-endian image
//! of warden's 64-bit words, so the bits are copied as they are.

use crate::bloom::chain::{Chain, Scheme};
use crate::bloom::codec::{BadData, Reader};
use crate::bloom::filter::{Hashing, SubFilter};

/// Option bits of a chain.
pub const NOROUND: u32 = 1;
pub const ENTS_IS_BITS: u32 = 2;
pub const FORCE64: u32 = 4;
pub const NO_SCALING: u32 = 8;
const KNOWN_OPTIONS: u32 = NOROUND | ENTS_IS_BITS | FORCE64 | NO_SCALING;

/// What RedisBloom 2.x creates: no power-of-two rounding, 64-bit hashes.
pub const DEFAULT_OPTIONS: u32 = NOROUND | FORCE64;

/// The RDB encoding RedisBloom 2.x writes, and the oldest one read.
pub const ENCVER: i32 = 4;
pub const OLDEST_ENCVER: i32 = 1;

/// Most links RedisBloom itself loads.
const MAX_LINKS: u64 = 1000;
/// Most probes a link of any positive double error rate can have.
pub const MAX_IMPORTED_HASHES: u64 = 1100;

const HEADER_FIXED: usize = 8 + 4 + 4 + 4;
const HEADER_PER_LINK: usize = 8 + 8 + 8 + 8 + 8 + 4 + 8 + 1;

/// ln 2 and ln² 2 exactly as RedisBloom writes them.
#[allow(clippy::approx_constant)]
const LN_2: f64 = 0.693147180559945;
const LN_2_SQUARED: f64 = 0.480453013918201;

pub fn hashing(options: u32) -> Hashing {
    if options & FORCE64 != 0 {
        Hashing::Murmur64
    } else {
        Hashing::Murmur32
    }
}

/// RedisBloom's bits per entry for an error rate.
pub fn bits_per_entry(error: f64) -> f64 {
    (error.ln() / LN_2_SQUARED).abs()
}

/// The chain-wide fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChainFields {
    pub items: u64,
    pub links: u64,
    pub options: u64,
    pub growth: u64,
}

/// One link's fields (its items come after its bits in the RDB).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LinkFields {
    pub capacity: u64,
    pub error: f64,
    pub hashes: u64,
    pub bits: u64,
    pub n2: u64,
}

/// The validated chain-wide part: scheme and expansion.
pub fn check_chain(c: &ChainFields) -> Result<(Scheme, Option<u32>), BadData> {
    let options = u32::try_from(c.options).map_err(|_| BadData::Malformed)?;
    if options & !KNOWN_OPTIONS != 0 || !(1..=MAX_LINKS).contains(&c.links) {
        return Err(BadData::Malformed);
    }
    let expansion = if options & NO_SCALING != 0 {
        if c.links != 1 {
            return Err(BadData::Malformed);
        }
        None
    } else {
        let growth = u32::try_from(c.growth).map_err(|_| BadData::Malformed)?;
        if growth == 0 {
            return Err(BadData::Malformed);
        }
        Some(growth)
    };
    Ok((Scheme::RedisBloom { options }, expansion))
}

/// A validated link's size in 64-bit words.
pub fn check_link(l: &LinkFields) -> Result<usize, BadData> {
    let sane = l.capacity >= 1
        && l.error > 0.0
        && l.error < 1.0
        && (1..=MAX_IMPORTED_HASHES).contains(&l.hashes)
        && l.bits > 0
        && l.bits.is_multiple_of(64)
        && l.n2 < 64
        && (l.n2 == 0 || 1u64 << l.n2 <= l.bits);
    if !sane {
        return Err(BadData::Malformed);
    }
    usize::try_from(l.bits / 64).map_err(|_| BadData::TooLarge)
}

/// A link over its bits, once `check_link` passed and the items are known.
pub fn link(l: &LinkFields, words: Vec<u64>, items: u64) -> Result<SubFilter, BadData> {
    if items > l.capacity || words.len() as u64 * 64 != l.bits {
        return Err(BadData::Malformed);
    }
    let mut f = SubFilter::from_words(words, l.capacity, l.error, l.hashes as u32, items);
    f.n2 = l.n2 as u8;
    Ok(f)
}

/// The chain, once its links are read: their items must add up.
pub fn chain(c: &ChainFields, filters: Vec<SubFilter>) -> Result<Chain, BadData> {
    let (scheme, expansion) = check_chain(c)?;
    let sum = filters
        .iter()
        .try_fold(0u64, |sum, f| sum.checked_add(f.items));
    if filters.len() as u64 != c.links || sum != Some(c.items) {
        return Err(BadData::Malformed);
    }
    Ok(Chain {
        filters,
        expansion,
        scheme,
    })
}

/// The option bits a chain is saved with.
pub fn options(chain: &Chain) -> u32 {
    match chain.scheme {
        Scheme::RedisBloom { options } => options,
        Scheme::Warden => DEFAULT_OPTIONS,
    }
}

/// The growth a chain is saved with (RedisBloom keeps 2 for non-scaling ones).
pub fn growth(chain: &Chain) -> u32 {
    chain.expansion.unwrap_or(2)
}

/// The fields of a link as saved.
pub fn fields(f: &SubFilter) -> LinkFields {
    LinkFields {
        capacity: f.capacity,
        error: f.error,
        hashes: u64::from(f.hashes),
        bits: f.words().len() as u64 * 64,
        n2: u64::from(f.n2),
    }
}

/// A new link's shape, sized as RedisBloom sizes it.
#[derive(Debug, PartialEq)]
pub struct Shape {
    pub capacity: u64,
    pub error: f64,
    pub hashes: u32,
    pub words: usize,
    pub n2: u8,
}

impl Shape {
    pub fn empty(&self) -> SubFilter {
        let mut f = SubFilter::from_words(
            vec![0; self.words],
            self.capacity,
            self.error,
            self.hashes,
            0,
        );
        f.n2 = self.n2;
        f
    }
}

/// The link RedisBloom's `bloom_init` would add for `capacity` items at
/// `error`: `capacity · bpe` bits in whole words (at least one bit) with
/// `NOROUND`; with `ENTS_IS_BITS`, `capacity` is the power of two of its bits
/// (at most 2^63 here) and its capacity `bits / bpe`; else the next power of
/// two, its spare bits counted as extra capacity. `None` where RedisBloom
/// fails (or would shift past 63 bits).
pub fn sized(capacity: u64, error: f64, options: u32) -> Option<Shape> {
    let bpe = bits_per_entry(error);
    let wanted = capacity as f64 * bpe;
    if !wanted.is_finite() || bpe <= 0.0 || capacity == 0 {
        return None;
    }
    let (bits, capacity, n2) = if options & ENTS_IS_BITS != 0 {
        if capacity > 63 {
            return None;
        }
        let bits = 1u64 << capacity;
        (bits, (bits as f64 / bpe) as u64, capacity as u8)
    } else if options & NOROUND != 0 {
        ((wanted as u64).max(1), capacity, 0)
    } else {
        if wanted < 1.0 {
            return None;
        }
        // C's logb: the binary exponent of a normal number.
        let n2 = ((wanted.to_bits() >> 52) & 0x7ff) as i64 - 1023 + 1;
        if !(1..64).contains(&n2) {
            return None;
        }
        let bits = 1u64 << n2;
        let spare = (bits as f64 - wanted) as u64;
        let extra = (spare as f64 / bpe) as u64;
        (bits, capacity.checked_add(extra)?, n2 as u8)
    };
    let words = usize::try_from(bits.div_ceil(64)).ok()?;
    Some(Shape {
        capacity,
        error,
        hashes: (LN_2 * bpe).ceil() as u32,
        words,
        n2,
    })
}

/// The `SCANDUMP` header of a chain.
pub fn encode_header(chain: &Chain) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_FIXED + HEADER_PER_LINK * chain.filters.len());
    out.extend_from_slice(&chain.items().to_le_bytes());
    out.extend_from_slice(&(chain.filters.len() as u32).to_le_bytes());
    out.extend_from_slice(&options(chain).to_le_bytes());
    out.extend_from_slice(&growth(chain).to_le_bytes());
    for f in &chain.filters {
        let l = fields(f);
        out.extend_from_slice(&(l.bits / 8).to_le_bytes());
        out.extend_from_slice(&l.bits.to_le_bytes());
        out.extend_from_slice(&f.items.to_le_bytes());
        out.extend_from_slice(&l.error.to_le_bytes());
        out.extend_from_slice(&bits_per_entry(l.error).to_le_bytes());
        out.extend_from_slice(&f.hashes.to_le_bytes());
        out.extend_from_slice(&l.capacity.to_le_bytes());
        out.push(f.n2);
    }
    out
}

/// An all-zero chain from a `SCANDUMP` header, refused before anything is
/// allocated if malformed or larger than `max_bytes`.
pub fn decode_header(bytes: &[u8], max_bytes: u64) -> Result<Chain, BadData> {
    let mut r = Reader(bytes);
    let c = ChainFields {
        items: r.u64()?,
        links: u64::from(r.u32()?),
        options: u64::from(r.u32()?),
        growth: u64::from(r.u32()?),
    };
    check_chain(&c)?;
    if bytes.len() as u64 != HEADER_FIXED as u64 + c.links * HEADER_PER_LINK as u64 {
        return Err(BadData::Malformed);
    }
    let mut links = Vec::with_capacity(c.links as usize);
    let mut total = std::mem::size_of::<Chain>() as f64;
    for _ in 0..c.links {
        let (byte_count, bits, items, error, _bpe, hashes, capacity, n2) = (
            r.u64()?,
            r.u64()?,
            r.u64()?,
            r.f64()?,
            r.f64()?,
            r.u32()?,
            r.u64()?,
            r.u8()?,
        );
        let l = LinkFields {
            capacity,
            error,
            hashes: u64::from(hashes),
            bits,
            n2: u64::from(n2),
        };
        let words = check_link(&l)?;
        if byte_count.checked_mul(8) != Some(bits) {
            return Err(BadData::Malformed);
        }
        total += words as f64 * 8.0 + std::mem::size_of::<SubFilter>() as f64;
        if total > max_bytes as f64 {
            return Err(BadData::TooLarge);
        }
        links.push((l, words, items));
    }
    let filters = links
        .into_iter()
        .map(|(l, words, items)| link(&l, vec![0; words], items))
        .collect::<Result<Vec<_>, _>>()?;
    chain(&c, filters)
}

/// A filter's fields as the RDB loader reads them, taken from `r` as
/// little-endian numbers: how the fuzz target reaches the RDB checks.
#[cfg(any(test, fuzzing))]
fn chain_from_fields(r: &mut Reader) -> Result<Chain, BadData> {
    let c = ChainFields {
        items: r.u64()?,
        links: r.u64()?,
        options: r.u64()?,
        growth: r.u64()?,
    };
    check_chain(&c)?;
    let mut filters = Vec::new();
    for _ in 0..c.links {
        let l = LinkFields {
            capacity: r.u64()?,
            error: r.f64()?,
            hashes: r.u64()?,
            bits: r.u64()?,
            n2: r.u64()?,
        };
        let words = check_link(&l)?;
        // Like the RDB: the bits must be there before anything is allocated.
        if r.0.len() / 8 < words {
            return Err(BadData::Malformed);
        }
        let mut bits = vec![0u64; words];
        for w in &mut bits {
            *w = r.u64()?;
        }
        filters.push(link(&l, bits, r.u64()?)?);
    }
    chain(&c, filters)
}

/// What the `redisbloom_codec` fuzz target runs on each input (and the unit
/// tests on every kept input): a `SCANDUMP` header (its length in the first
/// byte) with a chunk written into its filter, and the whole input read as
/// RDB fields; each filter that loads is then used.
#[cfg(any(test, fuzzing))]
pub fn exercise(data: &[u8]) {
    use crate::bloom::codec::load_chunk;
    let use_it = |mut chain: Chain| {
        if chain.add(b"item", 1 << 20).is_ok() {
            assert!(chain.contains(b"item"));
        }
        let again = decode_header(&encode_header(&chain), u64::MAX).expect("own header");
        assert_eq!(again.filters.len(), chain.filters.len());
    };
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let (header, rest) = data.split_at(split);
    if let Ok(mut chain) = decode_header(header.get(1..).unwrap_or_default(), 1 << 20) {
        let offset = rest
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let _ = load_chunk(&mut chain, offset, rest.get(8..).unwrap_or_default());
        use_it(chain);
    }
    if let Ok(chain) = chain_from_fields(&mut Reader(data)) {
        use_it(chain);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `BF.RESERVE a 0.01 10` and `BF.ADD a x` in RedisBloom 2.8.2: its
    /// `SCANDUMP` header and its one chunk.
    const HEADER: [u8; 73] = [
        1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 2, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 0, 128,
        0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0x7b, 0x14, 0xae, 0x47, 0xe1, 0x7a, 0x74,
        0x3f, 0xe9, 0x86, 0x2f, 0xb2, 0x35, 0x0e, 0x26, 0x40, 8, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0,
        0,
    ];
    const CHUNK: [u8; 16] = [
        0x40, 0x40, 0x40, 0, 0, 0x40, 0x40, 0x40, 0, 0, 0, 0x40, 0x40, 0, 0, 0,
    ];

    fn real() -> Chain {
        let mut chain = decode_header(&HEADER, 1 << 20).unwrap();
        crate::bloom::codec::load_chunk(&mut chain, 0, &CHUNK).unwrap();
        chain
    }

    #[test]
    fn a_real_header_decodes_and_encodes_back_byte_for_byte() {
        let chain = real();
        assert_eq!(chain.scheme, Scheme::RedisBloom { options: 5 });
        assert_eq!(chain.expansion, Some(2));
        assert_eq!((chain.capacity(), chain.items()), (10, 1));
        assert_eq!(chain.filters[0].hashes, 8);
        assert_eq!(chain.filters[0].error, 0.005);
        assert_eq!(encode_header(&chain), HEADER);
        assert!(chain.contains(b"x"));
    }

    #[test]
    fn links_are_sized_as_redisbloom_sizes_them() {
        // BF.DEBUG of RedisBloom 2.8.2 for chains of 0.01/100 and 0.05/50 EXPANSION 1.
        let cases = [
            (100, 0.005, 18, 8),
            (200, 0.0025, 39, 9),
            (800, 0.000625, 192, 11),
            (50, 0.025, 6, 6),
            (50, 4.8828125e-05, 17, 15),
            (10, 0.005, 2, 8),
        ];
        for (capacity, error, words, hashes) in cases {
            let shape = sized(capacity, error, DEFAULT_OPTIONS).unwrap();
            assert_eq!((shape.words, shape.hashes), (words, hashes), "{error}");
            assert_eq!((shape.capacity, shape.n2), (capacity, 0));
        }
        // Without NOROUND: the next power of two, the spare bits as capacity.
        let shape = sized(100, 0.01, FORCE64).unwrap();
        assert_eq!((shape.n2, shape.words), (10, 16));
        assert_eq!(shape.capacity, 106);
    }

    #[test]
    fn every_truncation_and_bit_flip_of_a_header_is_refused_or_consistent() {
        for cut in 0..HEADER.len() {
            assert!(decode_header(&HEADER[..cut], 1 << 20).is_err());
        }
        for i in 0..HEADER.len() {
            for bit in 0..8 {
                let mut bad = HEADER;
                bad[i] ^= 1 << bit;
                if let Ok(c) = decode_header(&bad, 1 << 20) {
                    assert!(c.filters.iter().all(|f| f.items <= f.capacity));
                    assert!(c.bytes() <= 1 << 20);
                }
            }
        }
    }

    #[test]
    fn headers_announcing_huge_links_are_refused_before_allocating() {
        let mut huge = HEADER;
        huge[20..28].copy_from_slice(&(1u64 << 40).to_le_bytes());
        huge[28..36].copy_from_slice(&(1u64 << 43).to_le_bytes());
        assert_eq!(decode_header(&huge, 1 << 20), Err(BadData::TooLarge));
    }

    #[test]
    fn inconsistent_fields_are_refused() {
        let whole = ChainFields {
            items: 1,
            links: 1,
            options: 5,
            growth: 2,
        };
        assert!(check_chain(&whole).is_ok());
        for bad in [
            ChainFields { links: 0, ..whole },
            ChainFields {
                links: 1001,
                ..whole
            },
            ChainFields {
                options: 16,
                ..whole
            },
            ChainFields { growth: 0, ..whole },
            ChainFields {
                growth: 1 << 32,
                ..whole
            },
            ChainFields {
                options: 13,
                links: 2,
                ..whole
            },
        ] {
            assert!(check_chain(&bad).is_err(), "{bad:?}");
        }
        let one = LinkFields {
            capacity: 10,
            error: 0.005,
            hashes: 8,
            bits: 128,
            n2: 0,
        };
        assert_eq!(check_link(&one), Ok(2));
        for bad in [
            LinkFields { capacity: 0, ..one },
            LinkFields { error: 0.0, ..one },
            LinkFields { error: 1.0, ..one },
            LinkFields {
                error: f64::NAN,
                ..one
            },
            LinkFields { hashes: 0, ..one },
            LinkFields {
                hashes: 5000,
                ..one
            },
            LinkFields { bits: 0, ..one },
            LinkFields { bits: 100, ..one },
            LinkFields { n2: 8, ..one },
            LinkFields { n2: 64, ..one },
        ] {
            assert!(check_link(&bad).is_err(), "{bad:?}");
        }
        assert!(check_link(&LinkFields { n2: 7, ..one }).is_ok());
        assert!(link(&one, vec![0; 2], 11).is_err());
        assert!(link(&one, vec![0; 3], 1).is_err());
        let f = link(&one, vec![0; 2], 2).unwrap();
        assert!(chain(&whole, vec![f.clone()]).is_err(), "items must add up");
        assert!(chain(&ChainFields { items: 2, ..whole }, vec![f]).is_ok());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        let mut next = crate::bloom::codec::xorshift();
        for len in 0..300 {
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            exercise(&bytes);
            let mut prefixed = HEADER.to_vec();
            prefixed.extend_from_slice(&bytes);
            exercise(&prefixed);
        }
    }

    #[test]
    fn kept_fuzz_inputs_still_pass() {
        crate::args::replay_kept_fuzz_inputs("redisbloom_codec", exercise);
    }
}
