//! The byte format of a filter, used by `BF.SCANDUMP`/`BF.LOADCHUNK`, RDB and
//! AOF: a header describing the chain, then the sub-filters' bits as
//! little-endian 64-bit words in chunks. Decoding trusts nothing: every field
//! is checked before anything is allocated.
//!
//! Header: `WDBF`, version (u8), flags (u8: bit 0 non-scaling), expansion
//! (u32), sub-filter count (u32), then per sub-filter capacity (u64), error
//! rate (f64), probes (u32), words (u64), items (u64). All little-endian.

use crate::bloom::chain::{Chain, Scheme, MAX_EXPANSION};
use crate::bloom::filter::{earlier, hashes_for, words_for, SubFilter, MAX_HASHES};

const MAGIC: &[u8; 4] = b"WDBF";
const VERSION: u8 = 1;
const FIXED: usize = 4 + 1 + 1 + 4 + 4;
const PER_FILTER: usize = 8 + 8 + 4 + 8 + 8;
const NON_SCALING: u8 = 1;

/// Largest chunk `SCANDUMP` and the AOF hand out: small enough that copying
/// one never stalls the server for long (clients loop on the iterator).
/// `LOADCHUNK` takes chunks of any size, so dumps made with larger chunks
/// still load.
pub const MAX_CHUNK: usize = 4 << 20;

/// Why bytes were refused.
#[derive(Debug, PartialEq, Eq)]
pub enum BadData {
    /// Malformed or inconsistent.
    Malformed,
    /// Well-formed, but larger than the memory limit.
    TooLarge,
}

pub fn encode_header(chain: &Chain) -> Vec<u8> {
    let mut out = Vec::with_capacity(FIXED + PER_FILTER * chain.filters.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(if chain.expansion.is_none() {
        NON_SCALING
    } else {
        0
    });
    out.extend_from_slice(&chain.expansion.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&(chain.filters.len() as u32).to_le_bytes());
    for f in &chain.filters {
        out.extend_from_slice(&f.capacity.to_le_bytes());
        out.extend_from_slice(&f.error.to_le_bytes());
        out.extend_from_slice(&f.hashes.to_le_bytes());
        out.extend_from_slice(&(f.words().len() as u64).to_le_bytes());
        out.extend_from_slice(&f.items.to_le_bytes());
    }
    out
}

/// One sub-filter as the header describes it.
#[derive(Debug, PartialEq)]
pub struct Shape {
    pub capacity: u64,
    pub error: f64,
    pub hashes: u32,
    pub words: usize,
    pub items: u64,
}

/// A validated header.
#[derive(Debug, PartialEq)]
pub struct Header {
    pub expansion: Option<u32>,
    pub filters: Vec<Shape>,
}

impl Header {
    /// Bytes of bits the header announces.
    #[cfg(test)]
    pub fn data_bytes(&self) -> u64 {
        self.filters.iter().map(|s| s.words as u64 * 8).sum()
    }

    /// An all-zero chain of this shape (the caller checked its size).
    pub fn empty_chain(&self) -> Chain {
        let filters = self
            .filters
            .iter()
            .map(|s| {
                SubFilter::from_words(vec![0; s.words], s.capacity, s.error, s.hashes, s.items)
            })
            .collect();
        Chain {
            filters,
            expansion: self.expansion,
            scheme: Scheme::Warden,
        }
    }
}

/// Little-endian fields off the front of a byte string.
pub struct Reader<'a>(pub &'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], BadData> {
        let (head, rest) = self.0.split_first_chunk::<N>().ok_or(BadData::Malformed)?;
        self.0 = rest;
        Ok(*head)
    }
    pub fn u8(&mut self) -> Result<u8, BadData> {
        Ok(self.take::<1>()?[0])
    }
    pub fn u32(&mut self) -> Result<u32, BadData> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    pub fn u64(&mut self) -> Result<u64, BadData> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    pub fn f64(&mut self) -> Result<f64, BadData> {
        Ok(f64::from_le_bytes(self.take()?))
    }
}

/// Decodes and checks a header; `max_bytes` bounds the filter it describes.
pub fn decode_header(bytes: &[u8], max_bytes: u64) -> Result<Header, BadData> {
    let mut r = Reader(bytes);
    if &r.take::<4>()? != MAGIC || r.u8()? != VERSION {
        return Err(BadData::Malformed);
    }
    let flags = r.u8()?;
    let expansion = r.u32()?;
    let count = r.u32()? as usize;
    if flags & !NON_SCALING != 0 || count == 0 || bytes.len() != FIXED + count * PER_FILTER {
        return Err(BadData::Malformed);
    }
    let expansion = match flags & NON_SCALING {
        0 if (1..=MAX_EXPANSION).contains(&expansion) => Some(expansion),
        NON_SCALING if expansion == 0 && count == 1 => None,
        _ => return Err(BadData::Malformed),
    };
    let mut filters = Vec::with_capacity(count);
    let mut total = std::mem::size_of::<Chain>() as f64;
    for _ in 0..count {
        let (capacity, error, hashes, words, items) =
            (r.u64()?, r.f64()?, r.u32()?, r.u64()?, r.u64()?);
        let sane = capacity >= 1
            && error > 0.0
            && error < 1.0
            && hashes <= MAX_HASHES
            && (hashes == hashes_for(error) || hashes == earlier::hashes_for(error))
            && (words as f64 == words_for(capacity, error)
                || words as f64 == earlier::words_for(capacity, error))
            && items <= capacity;
        if !sane {
            return Err(BadData::Malformed);
        }
        total += words as f64 * 8.0 + std::mem::size_of::<SubFilter>() as f64;
        if total > max_bytes as f64 {
            return Err(BadData::TooLarge);
        }
        filters.push(Shape {
            capacity,
            error,
            hashes,
            words: words as usize,
            items,
        });
    }
    Ok(Header { expansion, filters })
}

/// The chunk of bit data starting at byte `offset` (at most `MAX_CHUNK`
/// bytes, never crossing a sub-filter), or `None` past the end.
pub fn chunk_at(chain: &Chain, offset: u64) -> Option<Vec<u8>> {
    let mut start = offset;
    for f in &chain.filters {
        let len = f.words().len() as u64 * 8;
        if start < len {
            let end = (start + MAX_CHUNK as u64).min(len);
            return Some(read_bytes(f.words(), start as usize, end as usize));
        }
        start -= len;
    }
    None
}

/// Bytes `start..end` of the little-endian image of `words`.
pub fn read_bytes(words: &[u64], start: usize, end: usize) -> Vec<u8> {
    let (first, last) = (start / 8, end.div_ceil(8));
    let mut out = Vec::with_capacity((last - first) * 8);
    for w in &words[first..last] {
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.truncate(end - first * 8);
    if !start.is_multiple_of(8) {
        out.drain(..start % 8);
    }
    out
}

/// Writes `data` at byte `start` of the little-endian image of `words`;
/// the caller checked that it fits.
fn write_bytes(words: &mut [u64], start: usize, data: &[u8]) {
    let mut at = start;
    let mut rest = data;
    // A partial first word, byte by byte.
    while !at.is_multiple_of(8) && !rest.is_empty() {
        set_byte(words, at, rest[0]);
        at += 1;
        rest = &rest[1..];
    }
    let whole = rest.chunks_exact(8);
    let tail = whole.remainder();
    for (w, bytes) in words[at / 8..].iter_mut().zip(whole) {
        *w = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
    }
    at += rest.len() - tail.len();
    for (i, &b) in tail.iter().enumerate() {
        set_byte(words, at + i, b);
    }
}

fn set_byte(words: &mut [u64], at: usize, b: u8) {
    let mut bytes = words[at / 8].to_le_bytes();
    bytes[at % 8] = b;
    words[at / 8] = u64::from_le_bytes(bytes);
}

/// Writes `data` at byte `offset` of the chain's bit data; the chunk must lie
/// inside one sub-filter. Nothing is written if it does not fit.
pub fn load_chunk(chain: &mut Chain, offset: u64, data: &[u8]) -> Result<(), BadData> {
    let mut start = offset;
    for f in &mut chain.filters {
        let len = f.words().len() as u64 * 8;
        if start < len {
            let end = start
                .checked_add(data.len() as u64)
                .ok_or(BadData::Malformed)?;
            if data.is_empty() || end > len {
                return Err(BadData::Malformed);
            }
            write_bytes(f.words_mut(), start as usize, data);
            return Ok(());
        }
        start -= len;
    }
    Err(BadData::Malformed)
}

/// Bytes of bits per RDB piece. A sub-filter's bits are saved as pieces so
/// that loading copies them a little at a time (Redis serves events between
/// reads while it loads), and pieces that are all zero are not saved at all.
pub const PIECE: usize = 1 << 20;

/// Pieces of a sub-filter of `words` words.
pub fn pieces(words: usize) -> usize {
    (words * 8).div_ceil(PIECE)
}

/// The words of piece `index`.
fn piece_words(words: usize, index: usize) -> std::ops::Range<usize> {
    let per = PIECE / 8;
    let start = (index * per).min(words);
    start..(start + per).min(words)
}

/// Piece `index` of `words` as little-endian bytes, `None` if all its bits
/// are zero (or past the end).
pub fn piece(words: &[u64], index: usize) -> Option<Vec<u8>> {
    let range = piece_words(words.len(), index);
    let part = &words[range.clone()];
    if part.iter().all(|w| *w == 0) {
        return None;
    }
    Some(read_bytes(words, range.start * 8, range.end * 8))
}

/// Writes piece `index` into `words`; its length must be exactly the piece's.
pub fn load_piece(words: &mut [u64], index: usize, bytes: &[u8]) -> Result<(), BadData> {
    let range = piece_words(words.len(), index);
    if index >= pieces(words.len()) || bytes.len() != range.len() * 8 {
        return Err(BadData::Malformed);
    }
    write_bytes(words, range.start * 8, bytes);
    Ok(())
}

/// Fills `words` from little-endian bytes; the length must be exactly
/// `words.len() * 8` (the first RDB encoding: one string per sub-filter).
pub fn load_whole(words: &mut [u64], bytes: &[u8]) -> Result<(), BadData> {
    if bytes.len() != words.len() * 8 {
        return Err(BadData::Malformed);
    }
    write_bytes(words, 0, bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bloom::chain::Params;

    const MAX: u64 = 128 << 20;

    fn filled() -> Chain {
        let mut c = Chain::new(
            Params {
                capacity: 100,
                error: 0.01,
                expansion: Some(2),
            },
            MAX,
        )
        .unwrap();
        for i in 0..450u32 {
            c.add(&i.to_le_bytes(), MAX).unwrap();
        }
        c
    }

    /// Dumps a chain the way a client would with SCANDUMP, and loads it back.
    fn round_trip(c: &Chain) -> Chain {
        let header = decode_header(&encode_header(c), MAX).unwrap();
        let mut copy = header.empty_chain();
        let mut offset = 0;
        while let Some(chunk) = chunk_at(c, offset) {
            load_chunk(&mut copy, offset, &chunk).unwrap();
            offset += chunk.len() as u64;
        }
        assert_eq!(offset, header.data_bytes());
        copy
    }

    #[test]
    fn header_and_chunks_round_trip() {
        let c = filled();
        assert_eq!(round_trip(&c), c);
        let n = Chain::new(
            Params {
                capacity: 7,
                error: 0.2,
                expansion: None,
            },
            MAX,
        )
        .unwrap();
        assert_eq!(round_trip(&n), n);
    }

    #[test]
    fn every_truncation_and_bit_flip_of_a_header_is_refused_or_consistent() {
        let bytes = encode_header(&filled());
        for cut in 0..bytes.len() {
            assert!(decode_header(&bytes[..cut], MAX).is_err());
        }
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut bad = bytes.clone();
                bad[i] ^= 1 << bit;
                if let Ok(h) = decode_header(&bad, MAX) {
                    // Only the counts of items can change and stay consistent.
                    assert!(h.filters.iter().all(|s| s.items <= s.capacity));
                }
            }
        }
    }

    #[test]
    fn filters_sized_the_earlier_way_keep_their_sizes_and_probes() {
        let (capacity, error) = (1000, 0.5);
        let words = earlier::words_for(capacity, error) as usize;
        let old = Chain {
            filters: vec![SubFilter::from_words(
                vec![0; words],
                capacity,
                error,
                earlier::hashes_for(error),
                0,
            )],
            expansion: None,
            scheme: Scheme::Warden,
        };
        assert_ne!(earlier::hashes_for(error), hashes_for(error));
        assert_eq!(round_trip(&old), old);
    }

    #[test]
    fn headers_announcing_huge_filters_are_refused() {
        let c = Chain::new(
            Params {
                capacity: 10_000_000,
                error: 0.01,
                expansion: Some(2),
            },
            MAX,
        )
        .unwrap();
        let bytes = encode_header(&c);
        assert!(decode_header(&bytes, MAX).is_ok());
        assert_eq!(decode_header(&bytes, 1 << 20), Err(BadData::TooLarge));
    }

    #[test]
    fn chunks_outside_the_filter_are_refused() {
        let mut c = filled();
        let total = decode_header(&encode_header(&c), MAX).unwrap().data_bytes();
        assert!(load_chunk(&mut c, total, &[1]).is_err());
        assert!(load_chunk(&mut c, total - 1, &[1, 2]).is_err());
        assert!(load_chunk(&mut c, u64::MAX, &[1]).is_err());
        assert!(load_chunk(&mut c, 0, &[]).is_err());
    }

    #[test]
    fn word_bytes_must_match_exactly() {
        let mut words = [0u64; 2];
        load_whole(
            &mut words,
            &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        )
        .unwrap();
        assert_eq!(words, [1, 2 << 56]);
        assert!(load_whole(&mut words, &[0; 15]).is_err());
        assert!(load_whole(&mut words, &[0; 24]).is_err());
    }

    #[test]
    fn chunks_at_any_offset_read_and_write_the_same_bytes() {
        let words: Vec<u64> = (0..9u64)
            .map(|i| i.wrapping_mul(0x0123_4567_89ab_cdef))
            .collect();
        let image: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        for start in 0..image.len() {
            for end in start..=image.len() {
                assert_eq!(read_bytes(&words, start, end), &image[start..end]);
                let mut copy = vec![0u64; words.len()];
                write_bytes(&mut copy, start, &image[start..end]);
                let written: Vec<u8> = copy.iter().flat_map(|w| w.to_le_bytes()).collect();
                assert_eq!(&written[start..end], &image[start..end]);
                assert!(written[..start]
                    .iter()
                    .chain(&written[end..])
                    .all(|b| *b == 0));
            }
        }
    }

    #[test]
    fn pieces_cover_the_bits_and_skip_zeros() {
        let per = PIECE / 8;
        let mut words = vec![0u64; per * 2 + 3];
        assert_eq!(pieces(words.len()), 3);
        words[per * 2 + 2] = 7;
        assert_eq!(piece(&words, 0), None);
        assert_eq!(piece(&words, 1), None);
        let last = piece(&words, 2).unwrap();
        assert_eq!(last.len(), 24);
        let mut copy = vec![0u64; words.len()];
        load_piece(&mut copy, 2, &last).unwrap();
        assert_eq!(copy, words);
        assert!(load_piece(&mut copy, 3, &last).is_err());
        assert!(load_piece(&mut copy, 1, &last).is_err());
        assert!(load_piece(&mut copy, 2, &last[..16]).is_err());
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics() {
        // A cheap deterministic generator: every prefix of a pseudo-random stream,
        // and random streams behind a valid magic and version.
        let mut next = xorshift();
        for len in 0..400 {
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode_header(&bytes, MAX);
            if len >= 6 {
                bytes[..4].copy_from_slice(MAGIC);
                bytes[4] = VERSION;
                let _ = decode_header(&bytes, MAX);
            }
        }
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;
    use crate::bloom::chain::Params;

    proptest! {
        /// Any bytes are an error or a consistent header — never a panic, never
        /// a header announcing more than the limit.
        #[test]
        fn decoding_any_bytes_is_an_error_or_a_valid_header(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(h) = decode_header(&bytes, 1 << 20) {
                prop_assert!(!h.filters.is_empty());
                prop_assert!(h.data_bytes() <= 1 << 20);
            }
        }

        /// Valid magic and version followed by anything: still no panic.
        #[test]
        fn decoding_prefixed_bytes_never_panics(rest in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut bytes = b"WDBF\x01".to_vec();
            bytes.extend(rest);
            let _ = decode_header(&bytes, 1 << 20);
        }

        /// Any chunk at any offset is written whole or refused whole.
        #[test]
        fn chunks_load_whole_or_not_at_all(offset in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut chain = Chain::new(Params { capacity: 50, error: 0.01, expansion: Some(2) }, 1 << 20).unwrap();
            let before = chain.clone();
            if load_chunk(&mut chain, offset, &data).is_err() {
                prop_assert_eq!(chain, before);
            }
        }

        #[test]
        fn words_from_any_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64), words in 0usize..16, index in 0usize..4) {
            let mut w = vec![0u64; words];
            let _ = load_whole(&mut w, &bytes);
            let _ = load_piece(&mut w, index, &bytes);
        }
    }
}

/// What the `bloom_codec` fuzz target runs on each input (and the unit tests
/// on every kept input): a header, a chunk written into its filter, an add.
#[cfg(any(test, fuzzing))]
pub fn exercise(data: &[u8]) {
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let (header, rest) = data.split_at(split);
    let header = header.get(1..).unwrap_or_default();
    let _ = load_whole(&mut vec![0u64; rest.len() / 8], rest);
    if let Ok(h) = decode_header(header, 1 << 20) {
        let mut chain = h.empty_chain();
        let offset = rest
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        let _ = load_chunk(&mut chain, offset, rest.get(8..).unwrap_or_default());
        if chain.add(b"item", 1 << 20).is_ok() {
            assert!(chain.contains(b"item"));
        }
    }
}

#[cfg(test)]
#[test]
fn kept_codec_fuzz_inputs_still_pass() {
    crate::args::replay_kept_fuzz_inputs("bloom_codec", exercise);
}

/// A cheap deterministic byte stream for the decoders' never-panic tests.
#[cfg(test)]
pub(crate) fn xorshift() -> impl FnMut() -> u64 {
    let mut state = 0x9e3779b97f4a7c15u64;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
