//! The exact fingerprint of a tensor: BLAKE3 of its values as `f32` little-endian bytes, every NaN
//! as [`CANONICAL_NAN`], so two runs that computed bit-identical values are recognised as such,
//! whatever the framework and device.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The bits every NaN is fingerprinted (and captured) as: the quiet NaN `0x7fc00000`, whatever its
/// sign and payload. Frameworks and devices disagree on the NaN they produce (a GPU widens an
/// `f16` NaN to `0x7fffffff`, the CPU to `0x7fc00000`; `0.0 / 0.0` is `0xffc00000` on x86), and a
/// NaN is a NaN: a difference there is no difference of the computation.
pub const CANONICAL_NAN: u32 = 0x7fc0_0000;

/// Bytes of a fingerprint that a short one keeps ([`Fingerprint::short`]): 8, 16 hex digits.
pub const SHORT_FINGERPRINT_BYTES: usize = 8;

/// Values hashed per update when some of them must be rewritten (a NaN): 64 KiB, large enough
/// for BLAKE3's parallel hashing of whole chunks.
const REWRITE_CHUNK: usize = 16 * 1024;

/// BLAKE3 of the tensor's values, row-major, each as the 4 little-endian bytes of its `f32`, every
/// NaN as [`CANONICAL_NAN`].
///
/// Written as 64 lowercase hex digits. Equal fingerprints mean equal bits (the sign of zero
/// included; NaN payloads are not bits of a value); any other difference changes it completely,
/// so it answers only "identical or not": the [`Sketch`](super::Sketch) measures how far apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of `data`.
    #[must_use]
    pub fn of(data: &[f32]) -> Self {
        Self::of_counted(data, data.iter().any(|x| x.is_nan()))
    }

    /// The fingerprint of `data`, which holds a NaN if `has_nan` (known from its statistics:
    /// no second look at the values).
    pub(crate) fn of_counted(data: &[f32], has_nan: bool) -> Self {
        let mut hasher = blake3::Hasher::new();
        if cfg!(target_endian = "little") && !has_nan {
            hasher.update(as_bytes(data));
        } else {
            let mut bytes = vec![0u8; REWRITE_CHUNK.min(data.len()) * 4];
            for chunk in data.chunks(REWRITE_CHUNK) {
                for (slot, &value) in bytes.chunks_exact_mut(4).zip(chunk) {
                    slot.copy_from_slice(&canonical_bits(value).to_le_bytes());
                }
                hasher.update(&bytes[..chunk.len() * 4]);
            }
        }
        Self(*hasher.finalize().as_bytes())
    }
}

impl Fingerprint {
    /// The fingerprint cut to its first [`SHORT_FINGERPRINT_BYTES`] bytes, as golden files keep
    /// it (16 hex digits instead of 64: a tenth of a golden file's size). Its other bytes are
    /// zero, and it is written as 16 hex digits. Two tensors whose short fingerprints are
    /// equal are the same bits but for a chance of 2⁻⁶⁴ per pair.
    #[must_use]
    pub fn short(&self) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..SHORT_FINGERPRINT_BYTES].copy_from_slice(&self.0[..SHORT_FINGERPRINT_BYTES]);
        Self(bytes)
    }

    /// Whether it is a [`short`](Self::short) one: every byte after the first 8 is zero (which
    /// a whole BLAKE3 hash is with a chance of 2⁻¹⁹²).
    pub fn is_short(&self) -> bool {
        self.0[SHORT_FINGERPRINT_BYTES..]
            .iter()
            .all(|&byte| byte == 0)
    }

    /// Whether the two say that their tensors are the same bits: equal, or, when either is
    /// [`short`](Self::short), equal in the bytes both have.
    pub fn same_bits(&self, other: &Self) -> bool {
        if self.is_short() || other.is_short() {
            self.0[..SHORT_FINGERPRINT_BYTES] == other.0[..SHORT_FINGERPRINT_BYTES]
        } else {
            self == other
        }
    }

    /// Its hex digits: 16 for a short one, else 64.
    fn text(&self) -> ([u8; 64], usize) {
        let len = if self.is_short() {
            2 * SHORT_FINGERPRINT_BYTES
        } else {
            64
        };
        (self.hex(), len)
    }
}

/// The bits of `value`, [`CANONICAL_NAN`] for every NaN.
#[inline]
#[must_use]
pub fn canonical_bits(value: f32) -> u32 {
    if value.is_nan() {
        CANONICAL_NAN
    } else {
        value.to_bits()
    }
}

/// The bytes of `data` in memory, which are its little-endian bytes on a little-endian target.
fn as_bytes(data: &[f32]) -> &[u8] {
    // SAFETY: `f32` has no padding and every byte of it is initialised; `u8` has alignment 1 and
    // the length in bytes is the slice's size, so the new slice covers exactly the same memory,
    // borrowed for the same lifetime.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) }
}

impl Fingerprint {
    /// The 64 lowercase hex digits (written by hand: formatting 32 `{:02x}` costs ~30× more,
    /// and every tensor of a trace file has a fingerprint).
    fn hex(&self) -> [u8; 64] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut text = [0u8; 64];
        for (pair, byte) in text.chunks_exact_mut(2).zip(self.0) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0x0f)];
        }
        text
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (hex, len) = self.text();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&hex[..len]).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// A fingerprint that is neither 64 hex digits nor 16 (a [short](Fingerprint::short) one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintParseError(String);

impl fmt::Display for FingerprintParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "expected 64 hex digits for a fingerprint (16 for a short one), found {:?}",
            self.0
        )
    }
}

impl std::error::Error for FingerprintParseError {}

impl FromStr for Fingerprint {
    type Err = FingerprintParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || FingerprintParseError(text.chars().take(80).collect());
        if !matches!(text.len(), 64 | 16) || !text.is_ascii() {
            return Err(error());
        }
        let mut bytes = [0u8; 32];
        for (slot, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| error())?;
            *slot = u8::from_str_radix(pair, 16).map_err(|_| error())?;
        }
        Ok(Self(bytes))
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let (hex, len) = self.text();
        let text = std::str::from_utf8(&hex[..len]).map_err(serde::ser::Error::custom)?;
        serializer.serialize_str(text)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nan_is_hashed_as_the_canonical_one() {
        // The test vector of docs/trace-format.md (and of the Python writer's tests): 1.0, NaN,
        // -NaN, a signalling NaN, -0.0, +inf.
        let bits = [
            0x3f80_0000u32,
            0x7fc0_0000,
            0xffc0_0000,
            0x7f80_0001,
            0x8000_0000,
            0x7f80_0000,
        ];
        let data = bits.map(f32::from_bits);
        assert_eq!(
            Fingerprint::of(&data).to_string(),
            "d03df72855a09d83053c18f5164f3e6aa9906510ec4ab24c528f4026fc67a013"
        );
        let canonical = [1.0, f32::NAN, f32::NAN, f32::NAN, -0.0, f32::INFINITY];
        assert_eq!(Fingerprint::of(&data), Fingerprint::of(&canonical));
        // Past one rewrite chunk, and with the NaN only in the second chunk.
        let mut long = vec![0.5f32; REWRITE_CHUNK + 3];
        long[REWRITE_CHUNK + 1] = f32::from_bits(0xffff_ffff);
        let mut canonical_long = long.clone();
        canonical_long[REWRITE_CHUNK + 1] = f32::NAN;
        assert_eq!(Fingerprint::of(&long), Fingerprint::of(&canonical_long));
        let mut bytes = Vec::new();
        for v in &canonical_long {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(Fingerprint::of(&long).0, *blake3::hash(&bytes).as_bytes());
    }

    #[test]
    fn hashes_the_little_endian_bytes() {
        let data = [1.0f32, -0.0, f32::NAN, 3.5];
        let mut bytes = Vec::new();
        for v in data {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        assert_eq!(Fingerprint::of(&data).0, *blake3::hash(&bytes).as_bytes());
        // -0.0 and 0.0 compare equal as floats but are different bits
        assert_ne!(Fingerprint::of(&[0.0]), Fingerprint::of(&[-0.0]));
        // the empty tensor: BLAKE3 of no bytes
        assert_eq!(
            Fingerprint::of(&[]).to_string(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn text_round_trip_and_errors() {
        let fingerprint = Fingerprint::of(&[1.0, 2.0]);
        let json = serde_json::to_string(&fingerprint).unwrap();
        assert_eq!(json.len(), 66);
        assert_eq!(
            serde_json::from_str::<Fingerprint>(&json).unwrap(),
            fingerprint
        );
        for bad in ["\"abc\"", "\"zz\"", "12"] {
            assert!(serde_json::from_str::<Fingerprint>(bad).is_err(), "{bad}");
        }
        let not_hex = format!("\"{}\"", "g".repeat(64));
        assert!(serde_json::from_str::<Fingerprint>(&not_hex).is_err());
    }

    #[test]
    fn a_short_fingerprint_is_its_first_bytes_and_matches_its_whole_one() {
        let whole = Fingerprint::of(&[1.0, 2.0]);
        let short = whole.short();
        assert!(short.is_short() && !whole.is_short());
        assert_eq!(short.to_string(), whole.to_string()[..16]);
        let json = serde_json::to_string(&short).unwrap();
        assert_eq!(json.len(), 18);
        assert_eq!(serde_json::from_str::<Fingerprint>(&json).unwrap(), short);
        assert!(short.same_bits(&whole) && whole.same_bits(&short) && short.same_bits(&short));
        let other = Fingerprint::of(&[1.0, 2.5]);
        assert!(!short.same_bits(&other) && !other.same_bits(&short));
        assert!(!whole.same_bits(&other) && whole.same_bits(&whole));
        assert!("0123456789abcde".parse::<Fingerprint>().is_err());
    }
}
