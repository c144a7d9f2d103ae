//! Parameter scalars.

use core::fmt::Debug;

/// A parameter scalar: `f32`, `f64` or `i64`.
///
/// Values travel as raw little-endian bytes and are compared and hashed by their bit patterns
/// ([`Value::to_bits`]), so that node state holding floats is still `Eq + Hash` (as the model
/// checker needs) and a NaN equals itself. `i64` gives exact arithmetic, which the models and the
/// exactly-once checks rely on; its arithmetic wraps instead of panicking on overflow, because the
/// operands may come from the network.
pub trait Value: bytemuck::Pod + Default + Debug + PartialOrd + Send + Sync + 'static {
    /// Bytes per value on the wire.
    const SIZE: usize;
    /// Name used in messages and on the command line (`"f32"`, `"f64"`, `"i64"`).
    const NAME: &'static str;

    /// The bit pattern used for equality and hashing.
    fn to_bits(self) -> u64;
    /// Reads a value from exactly [`Value::SIZE`] little-endian bytes.
    fn from_le_slice(bytes: &[u8]) -> Self;
    /// Appends the value's little-endian bytes to `out`.
    fn extend_le(self, out: &mut Vec<u8>);
    /// `self + other` (wrapping for integers).
    fn add(self, other: Self) -> Self;
    /// `self - other` (wrapping for integers).
    fn sub(self, other: Self) -> Self;
    /// Converts from `f64` (rounding toward zero and saturating for integers).
    fn from_f64(x: f64) -> Self;
    /// Converts to `f64`.
    fn to_f64(self) -> f64;
}

macro_rules! float_value {
    ($t:ty, $name:literal) => {
        impl Value for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            const NAME: &'static str = $name;

            #[inline]
            fn to_bits(self) -> u64 {
                u64::from(<$t>::to_bits(self))
            }
            #[inline]
            fn from_le_slice(bytes: &[u8]) -> Self {
                let mut raw = [0u8; core::mem::size_of::<$t>()];
                raw.copy_from_slice(bytes);
                <$t>::from_le_bytes(raw)
            }
            #[inline]
            fn extend_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            #[inline]
            fn add(self, other: Self) -> Self {
                self + other
            }
            #[inline]
            fn sub(self, other: Self) -> Self {
                self - other
            }
            #[inline]
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                f64::from(self)
            }
        }
    };
}

float_value!(f32, "f32");
float_value!(f64, "f64");

impl Value for i64 {
    const SIZE: usize = 8;
    const NAME: &'static str = "i64";

    #[inline]
    fn to_bits(self) -> u64 {
        self as u64
    }
    #[inline]
    fn from_le_slice(bytes: &[u8]) -> Self {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(bytes);
        i64::from_le_bytes(raw)
    }
    #[inline]
    fn extend_le(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    #[inline]
    fn add(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    #[inline]
    fn sub(self, other: Self) -> Self {
        self.wrapping_sub(other)
    }
    #[inline]
    fn from_f64(x: f64) -> Self {
        x as i64
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<V: Value>(v: V) -> V {
        let mut out = Vec::new();
        v.extend_le(&mut out);
        assert_eq!(out.len(), V::SIZE);
        V::from_le_slice(&out)
    }

    #[test]
    fn values_round_trip_through_little_endian_bytes() {
        assert_eq!(Value::to_bits(round_trip(-1.5f32)), Value::to_bits(-1.5f32));
        assert_eq!(round_trip(f64::NAN).to_bits(), Value::to_bits(f64::NAN));
        assert_eq!(round_trip(i64::MIN), i64::MIN);
    }

    #[test]
    fn integer_arithmetic_wraps_instead_of_panicking() {
        assert_eq!(Value::add(i64::MAX, 1), i64::MIN);
        assert_eq!(Value::sub(i64::MIN, 1), i64::MAX);
    }

    #[test]
    fn equality_by_bits_separates_signed_zeros_and_keeps_nan() {
        assert_ne!(Value::to_bits(0.0f32), Value::to_bits(-0.0f32));
        assert_eq!(Value::to_bits(f32::NAN), Value::to_bits(f32::NAN));
    }
}
