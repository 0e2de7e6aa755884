//! The exact fingerprint of a tensor: BLAKE3 of its values as `f32` little-endian bytes, so two
//! runs that computed bit-identical values are recognised as such, whatever the framework.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// BLAKE3 of the tensor's values, row-major, each as the 4 little-endian bytes of its `f32`.
///
/// Written as 64 lowercase hex digits. Equal fingerprints mean equal bits (NaN payloads and
/// the sign of zero included); any other difference changes it completely, so it answers only
/// "identical or not": the [`Sketch`](super::Sketch) measures how far apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    /// The fingerprint of `data`.
    #[must_use]
    pub fn of(data: &[f32]) -> Self {
        let mut hasher = blake3::Hasher::new();
        if cfg!(target_endian = "little") {
            hasher.update(as_bytes(data));
        } else {
            for chunk in data.chunks(256) {
                let mut bytes = [0u8; 1024];
                for (slot, value) in bytes.chunks_exact_mut(4).zip(chunk) {
                    slot.copy_from_slice(&value.to_le_bytes());
                }
                hasher.update(&bytes[..chunk.len() * 4]);
            }
        }
        Self(*hasher.finalize().as_bytes())
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
        let hex = self.hex();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

/// A fingerprint that is not 64 hex digits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FingerprintParseError(String);

impl fmt::Display for FingerprintParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "expected 64 hex digits for a fingerprint, found {:?}",
            self.0
        )
    }
}

impl std::error::Error for FingerprintParseError {}

impl FromStr for Fingerprint {
    type Err = FingerprintParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || FingerprintParseError(text.chars().take(80).collect());
        if text.len() != 64 || !text.is_ascii() {
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
        let hex = self.hex();
        let text = std::str::from_utf8(&hex).map_err(serde::ser::Error::custom)?;
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
}
