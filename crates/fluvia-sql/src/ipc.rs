//! Arrow IPC framing of one record batch as one Fluvia record.
//!
//! Both ends know the schema from the plan, so a record carries only the
//! record-batch message: `u32 metadata length | flatbuffer metadata | body`.
//! No IPC compression: Fluvia's network buffers are LZ4-compressed below
//! this layer when `taskmanager.network.compression.codec` says so.

use datafusion::arrow::array::{Array, ArrayRef, BinaryViewArray, StringViewArray};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::read_record_batch;
use datafusion::arrow::ipc::root_as_message;
use datafusion::arrow::ipc::writer::{
    DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
};
use datafusion::arrow::record_batch::RecordBatch;
use std::collections::HashMap;
use std::sync::Arc;

/// Encodes batches; keeps scratch space between calls.
#[derive(Default)]
pub struct IpcEncoder {
    generator: IpcDataGenerator,
    options: IpcWriteOptions,
    context: IpcWriteContext,
    buf: Vec<u8>,
}

impl IpcEncoder {
    /// The encoded batch, valid until the next call.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<&[u8], ArrowError> {
        let batch = compact_views(batch)?;
        let mut tracker = DictionaryTracker::new(false);
        let (dicts, data) =
            self.generator
                .encode(&batch, &mut tracker, &self.options, &mut self.context)?;
        if !dicts.is_empty() {
            return Err(ArrowError::NotYetImplemented(
                "dictionary-encoded columns cannot cross an exchange".into(),
            ));
        }
        self.buf.clear();
        self.buf
            .extend_from_slice(&(data.ipc_message.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(&data.ipc_message);
        self.buf.extend_from_slice(&data.arrow_data);
        Ok(&self.buf)
    }
}

/// View arrays may point into large shared buffers; shipping them would
/// ship the whole buffers.
fn compact_views(batch: &RecordBatch) -> Result<RecordBatch, ArrowError> {
    let has_views = batch
        .columns()
        .iter()
        .any(|c| c.as_any().is::<StringViewArray>() || c.as_any().is::<BinaryViewArray>());
    if !has_views {
        return Ok(batch.clone());
    }
    let columns: Vec<ArrayRef> = batch
        .columns()
        .iter()
        .map(|c| {
            if let Some(a) = c.as_any().downcast_ref::<StringViewArray>() {
                Arc::new(a.gc()) as ArrayRef
            } else if let Some(a) = c.as_any().downcast_ref::<BinaryViewArray>() {
                Arc::new(a.gc()) as ArrayRef
            } else {
                Arc::clone(c)
            }
        })
        .collect();
    RecordBatch::try_new(batch.schema(), columns)
}

/// Decodes one record written by [`IpcEncoder::encode`].
pub fn decode(bytes: &[u8], schema: &SchemaRef) -> Result<RecordBatch, ArrowError> {
    let corrupt = |what: &str| ArrowError::IpcError(format!("corrupt exchange record: {what}"));
    if bytes.len() < 4 {
        return Err(corrupt("shorter than its header"));
    }
    let meta_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let meta = bytes
        .get(4..4 + meta_len)
        .ok_or_else(|| corrupt("metadata longer than the record"))?;
    let message = root_as_message(meta).map_err(|e| corrupt(&e.to_string()))?;
    let header = message
        .header_as_record_batch()
        .ok_or_else(|| corrupt("not a record batch message"))?;
    let body = Buffer::from(&bytes[4 + meta_len..]);
    read_record_batch(
        &body,
        header,
        Arc::clone(schema),
        &HashMap::new(),
        None,
        &message.version(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Date32Array, Decimal128Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn round_trip_keeps_values_nulls_and_types() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("d", DataType::Date32, true),
            Field::new("m", DataType::Decimal128(7, 2), true),
            Field::new("v", DataType::Utf8View, true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None, Some(-3)])),
                Arc::new(StringArray::from(vec![Some("a, b"), Some(""), None])),
                Arc::new(Date32Array::from(vec![Some(10957), None, Some(0)])),
                Arc::new(
                    Decimal128Array::from(vec![Some(12345), None, Some(-1)])
                        .with_precision_and_scale(7, 2)
                        .unwrap(),
                ),
                Arc::new(StringViewArray::from(vec![
                    Some("a long string that is not inlined"),
                    None,
                    Some("x"),
                ])),
            ],
        )
        .unwrap();
        let mut enc = IpcEncoder::default();
        for b in [batch.clone(), batch.slice(1, 2), batch.slice(0, 0)] {
            let bytes = enc.encode(&b).unwrap().to_vec();
            let back = decode(&bytes, &schema).unwrap();
            assert_eq!(back, b);
        }
    }

    #[test]
    fn garbage_is_an_error() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, true)]));
        for bad in [
            &[1u8, 2][..],
            &[255, 255, 255, 255, 0][..],
            &[4, 0, 0, 0, 1, 2, 3, 4][..],
        ] {
            assert!(decode(bad, &schema).is_err());
        }
    }
}
