//! Hashing for maps keyed by something already unique and well spread, an address or a
//! counter's id: std's default (SipHash, built to resist chosen keys) cost ~140 instructions a
//! hash (callgrind) on paths that run for every traced tensor, where one multiplication does.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A `HashMap` whose keys hash to a multiple of themselves (see [`IdHasher`]).
pub(crate) type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

/// Fibonacci hashing of integer keys: the key times 2⁶⁴/φ, whose high bits depend on every
/// bit of the key, folded onto the low bits (a `HashMap` picks the bucket from the low bits,
/// and the product's low bits depend only on the key's low bits, which aligned addresses
/// share). Addresses that differ only in a few bits, or ids that count up, spread over the
/// table. Keys of other types (bytes) are folded in eight at a time.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

/// ⌊2⁶⁴/φ⌋, odd.
const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(GOLDEN);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    fn hash<T: std::hash::Hash>(value: T) -> u64 {
        BuildHasherDefault::<IdHasher>::default().hash_one(value)
    }

    #[test]
    fn neighbouring_keys_differ_in_the_tag_and_the_low_byte() {
        // A table of 2^k buckets uses the top 7 bits as tags and the low bits as the index:
        // both must change between addresses 16 bytes apart and between consecutive ids.
        for step in [1usize, 8, 16, 64] {
            let (a, b) = (hash(0x7f00_1000usize), hash(0x7f00_1000usize + step));
            assert_ne!(a >> 57, b >> 57, "step {step}");
            assert_ne!(a & 0xff, b & 0xff, "step {step}");
        }
    }

    #[test]
    fn aligned_addresses_spread_over_the_low_byte() {
        let low_bytes: std::collections::HashSet<u64> = (0..256usize)
            .map(|i| hash(0x7f00_0000 + 64 * i) & 0xff)
            .collect();
        assert!(low_bytes.len() > 150, "{} of 256", low_bytes.len());
    }

    #[test]
    fn a_map_finds_what_it_holds() {
        let mut map: IdMap<usize, usize> = IdMap::default();
        for key in (0..10_000).map(|i| 0x5555_0000 + 16 * i) {
            map.insert(key, key / 16);
        }
        assert_eq!(map.len(), 10_000);
        assert!(
            (0..10_000).all(|i| map.get(&(0x5555_0000 + 16 * i)) == Some(&(0x5555_0000 / 16 + i)))
        );
        let mut strings: IdMap<&str, u8> = IdMap::default();
        strings.insert("layer", 1);
        strings.insert("layers", 2);
        assert_eq!((strings["layer"], strings["layers"]), (1, 2));
    }
}
