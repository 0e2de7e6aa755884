//! How floats travel through JSON without loss: finite values as numbers (the shortest text that
//! reads back to the same `f32`), NaN and ±infinity as the strings `"NaN"`, `"inf"`, `"-inf"`.
//!
//! `serde_json` would write non-finite floats as `null`, which cannot say which of the three it
//! was and does not read back as a float; a trace of a model that produces NaN must stay exact.
//! Every `f32` of a record goes through one of the modules here (`#[serde(with = ...)]`).

use std::fmt;

use serde::de::{self, Visitor};
use serde::ser::{SerializeSeq, Serializer};

/// The text of a non-finite value, `None` for a finite one.
pub(crate) fn non_finite_name(value: f32) -> Option<&'static str> {
    if value.is_nan() {
        Some("NaN")
    } else if value == f32::INFINITY {
        Some("inf")
    } else if value == f32::NEG_INFINITY {
        Some("-inf")
    } else {
        None
    }
}

fn serialize_one<S: Serializer>(value: f32, serializer: S) -> Result<S::Ok, S::Error> {
    match non_finite_name(value) {
        Some(name) => serializer.serialize_str(name),
        None => serializer.serialize_f32(value),
    }
}

/// Reads a number or one of the three names.
struct F32Visitor;

impl Visitor<'_> for F32Visitor {
    type Value = f32;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, \"NaN\", \"inf\" or \"-inf\"")
    }

    #[allow(clippy::cast_possible_truncation)]
    fn visit_f64<E: de::Error>(self, value: f64) -> Result<f32, E> {
        // An f32 written as its shortest decimal reads back exactly through f64.
        Ok(value as f32)
    }

    #[allow(clippy::cast_precision_loss)]
    fn visit_i64<E: de::Error>(self, value: i64) -> Result<f32, E> {
        Ok(value as f32)
    }

    #[allow(clippy::cast_precision_loss)]
    fn visit_u64<E: de::Error>(self, value: u64) -> Result<f32, E> {
        Ok(value as f32)
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<f32, E> {
        match value {
            "NaN" => Ok(f32::NAN),
            "inf" => Ok(f32::INFINITY),
            "-inf" => Ok(f32::NEG_INFINITY),
            other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
        }
    }
}

/// One `f32`.
pub(crate) mod single {
    use super::{serialize_one, F32Visitor};
    use serde::{Deserializer, Serializer};

    #[allow(clippy::trivially_copy_pass_by_ref)] // the signature `#[serde(with)]` requires
    pub(crate) fn serialize<S: Serializer>(value: &f32, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_one(*value, serializer)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f32, D::Error> {
        deserializer.deserialize_any(F32Visitor)
    }
}

/// An `Option<f32>`: `null` is `None`.
pub(crate) mod option {
    use super::{serialize_one, F32Visitor};
    use serde::de::{Deserializer, Visitor};
    use serde::Serializer;
    use std::fmt;

    #[allow(clippy::ref_option)] // the signature `#[serde(with)]` requires
    pub(crate) fn serialize<S: Serializer>(
        value: &Option<f32>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serialize_one(*value, serializer),
            None => serializer.serialize_none(),
        }
    }

    struct OptionVisitor;

    impl<'de> Visitor<'de> for OptionVisitor {
        type Value = Option<f32>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("null, a number, \"NaN\", \"inf\" or \"-inf\"")
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<Self::Value, D::Error> {
            inner.deserialize_any(F32Visitor).map(Some)
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<f32>, D::Error> {
        deserializer.deserialize_option(OptionVisitor)
    }
}

/// A `Vec<f32>` (or anything that derefs to `[f32]` when written).
pub(crate) mod vec {
    use super::Element;
    use serde::de::{Deserializer, SeqAccess, Visitor};
    use serde::ser::Serializer;
    use std::fmt;

    pub(crate) fn serialize<S: Serializer>(
        values: &[f32],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        super::serialize_slice(values, serializer)
    }

    struct VecVisitor;

    impl<'de> Visitor<'de> for VecVisitor {
        type Value = Vec<f32>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an array of numbers, \"NaN\", \"inf\" or \"-inf\"")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<f32>, A::Error> {
            let mut values = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
            while let Some(value) = seq.next_element_seed(Element)? {
                values.push(value);
            }
            Ok(values)
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Vec<f32>, D::Error> {
        deserializer.deserialize_seq(VecVisitor)
    }
}

/// `[f32]` as a JSON array of lossless values.
fn serialize_slice<S: Serializer>(values: &[f32], serializer: S) -> Result<S::Ok, S::Error> {
    let mut seq = serializer.serialize_seq(Some(values.len()))?;
    for &value in values {
        seq.serialize_element(&Lossless(value))?;
    }
    seq.end()
}

/// One element of a sequence of lossless floats.
struct Element;

impl<'de> de::DeserializeSeed<'de> for Element {
    type Value = f32;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<f32, D::Error> {
        deserializer.deserialize_any(F32Visitor)
    }
}

/// An `f32` that serializes losslessly; for the element of a sequence.
struct Lossless(f32);

impl serde::Serialize for Lossless {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_one(self.0, serializer)
    }
}

/// A fixed-size `[f32; N]`, written as an array of exactly `N` values.
pub(crate) mod array {
    use super::Element;
    use serde::de::{Deserializer, Error as _, SeqAccess, Visitor};
    use serde::Serializer;
    use std::fmt;

    pub(crate) fn serialize<S: Serializer, const N: usize>(
        values: &[f32; N],
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        super::serialize_slice(values, serializer)
    }

    struct ArrayVisitor<const N: usize>;

    impl<'de, const N: usize> Visitor<'de> for ArrayVisitor<N> {
        type Value = [f32; N];

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an array of {N} numbers")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<[f32; N], A::Error> {
            let mut values = [0.0; N];
            for (i, slot) in values.iter_mut().enumerate() {
                *slot = seq
                    .next_element_seed(Element)?
                    .ok_or_else(|| A::Error::invalid_length(i, &self))?;
            }
            if seq.next_element_seed(Element)?.is_some() {
                return Err(A::Error::invalid_length(N + 1, &self));
            }
            Ok(values)
        }
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>, const N: usize>(
        deserializer: D,
    ) -> Result<[f32; N], D::Error> {
        deserializer.deserialize_seq(ArrayVisitor::<N>)
    }
}
