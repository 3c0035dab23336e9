//! Records and their wire codec. Any `Clone + Send + Serialize +
//! DeserializeOwned + 'static` type is a record; non-chained edges encode it
//! with bincode's fixed-width little-endian format, which is fast for the
//! small tuples dataflows move.

use fluvia_core::{FluviaError, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// What a stream element must be.
pub trait Data: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Serialize + DeserializeOwned + 'static> Data for T {}

/// Appends the encoding of `record` to `buf`.
#[inline]
pub fn encode_into<T: Serialize>(record: &T, buf: &mut Vec<u8>) -> Result<()> {
    bincode::serialize_into(buf, record)
        .map_err(|e| FluviaError::Serialization(format!("encoding a record: {e}")))
}

/// Decodes one record that fills `bytes` exactly.
#[inline]
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    bincode::deserialize(bytes).map_err(|e| {
        FluviaError::Serialization(format!(
            "decoding a record of {} bytes as {}: {e}",
            bytes.len(),
            std::any::type_name::<T>()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_bytes() {
        let mut buf = Vec::new();
        encode_into(&("word".to_string(), 3i64), &mut buf).unwrap();
        let back: (String, i64) = decode(&buf).unwrap();
        assert_eq!(back, ("word".to_string(), 3));
        let err = decode::<(String, i64)>(&buf[..5]).unwrap_err().to_string();
        assert!(err.contains("decoding a record"), "{err}");
    }
}
