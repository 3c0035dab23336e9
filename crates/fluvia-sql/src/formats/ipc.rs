//! Arrow IPC framing of one record batch as one Fluvia record.
//!
//! Both ends know the schema from the plan, so a record carries only the
//! record-batch message: `u32 metadata length | flatbuffer metadata (zero
//! padded) | body`. The padding puts the body 16 bytes into the record plus
//! a multiple of 16, after the network's own 4-byte length header: a record
//! the deserializer gathered from several buffers into one allocation is
//! read in place, its columns aligned, instead of being copied once more.
//! The encoder hands the header and the body over as two parts, written
//! into the network buffers one after the other, so the body is not first
//! copied into one slice with its header either.
//! No IPC compression: Fluvia's network buffers are LZ4-compressed below
//! this layer when `taskmanager.network.compression.codec` says so.

use arrow_data::{UnsafeFlag, validate_binary_view};
use datafusion::arrow::array::ArrayData;
use datafusion::arrow::array::{Array, ArrayRef, BinaryViewArray, StringViewArray};
use datafusion::arrow::buffer::Buffer;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::ipc::reader::RecordBatchDecoder;
use datafusion::arrow::ipc::writer::{
    DictionaryTracker, IpcDataGenerator, IpcWriteContext, IpcWriteOptions,
};
use datafusion::arrow::ipc::{Message, root_as_message};
use datafusion::arrow::record_batch::RecordBatch;
use std::collections::HashMap;
use std::sync::Arc;

/// Encodes batches; keeps scratch space between calls.
#[derive(Default)]
pub struct IpcEncoder {
    generator: IpcDataGenerator,
    options: IpcWriteOptions,
    context: IpcWriteContext,
    head: Vec<u8>,
    body: Vec<u8>,
    whole: Vec<u8>,
}

/// Metadata length padded so that the network's length header, ours and the
/// metadata end on a multiple of 16 bytes (the body's alignment in a
/// record read in place).
fn padded_meta_len(len: usize) -> usize {
    let before = fluvia_network::RECORD_HEADER + 4;
    (before + len).next_multiple_of(16) - before
}

impl IpcEncoder {
    /// The encoded batch as two parts, header and body, valid until the
    /// next call: the record is their concatenation.
    pub fn encode_parts(&mut self, batch: &RecordBatch) -> Result<[&[u8]; 2], ArrowError> {
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
        let padded = padded_meta_len(data.ipc_message.len());
        self.head.clear();
        self.head.extend_from_slice(&(padded as u32).to_le_bytes());
        self.head.extend_from_slice(&data.ipc_message);
        self.head.resize(4 + padded, 0);
        self.body = data.arrow_data;
        Ok([&self.head, &self.body])
    }

    /// The encoded batch in one slice, valid until the next call.
    pub fn encode(&mut self, batch: &RecordBatch) -> Result<&[u8], ArrowError> {
        self.encode_parts(batch)?;
        self.whole.clear();
        self.whole.extend_from_slice(&self.head);
        self.whole.extend_from_slice(&self.body);
        Ok(&self.whole)
    }
}

/// The most bytes (estimated, as encoded) one exchange record carries.
/// Bigger batches cross as row slices: no record nears the network's record
/// limit, and no receiver is handed a string column whose offsets would
/// pass 32 bits.
pub const MAX_EXCHANGE_BATCH_BYTES: usize = 64 << 20;

/// Bytes `a` adds to an encoded batch: its values only (a slice counts its
/// part of shared buffers; a view array what its views point at).
fn encoded_bytes(a: &dyn Array) -> usize {
    if let Some(v) = a.as_any().downcast_ref::<StringViewArray>() {
        return v.total_bytes_len() + 16 * v.len();
    }
    if let Some(v) = a.as_any().downcast_ref::<BinaryViewArray>() {
        return v.total_bytes_len() + 16 * v.len();
    }
    a.to_data()
        .get_slice_memory_size()
        .unwrap_or_else(|_| a.get_array_memory_size())
}

/// `batch` cut into row slices of at most [`MAX_EXCHANGE_BATCH_BYTES`]
/// (estimated; one row bigger than that goes alone). Slices share buffers.
pub fn exchange_pieces(batch: &RecordBatch) -> Vec<RecordBatch> {
    let bytes: usize = batch.columns().iter().map(|c| encoded_bytes(c)).sum();
    let rows = batch.num_rows();
    if bytes <= MAX_EXCHANGE_BATCH_BYTES || rows <= 1 {
        return vec![batch.clone()];
    }
    let pieces = bytes.div_ceil(MAX_EXCHANGE_BATCH_BYTES).min(rows);
    let per_piece = rows.div_ceil(pieces);
    (0..rows)
        .step_by(per_piece)
        .map(|start| batch.slice(start, per_piece.min(rows - start)))
        .collect()
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
    let (message, body_start) = message(bytes)?;
    let body = Buffer::from(&bytes[body_start..]);
    batch(message, &body, schema)
}

/// Decodes one record as the network deserializer handed it over: one
/// gathered from several buffers is read in place, without a copy.
pub fn decode_record(
    record: fluvia_network::RecordBytes<'_>,
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    match record {
        fluvia_network::RecordBytes::InBuffer(bytes) => decode(bytes, schema),
        fluvia_network::RecordBytes::Reassembled(v) => {
            let header = fluvia_network::RECORD_HEADER;
            let all = Buffer::from_vec(v);
            let bytes = all.get(header..).ok_or_else(|| {
                ArrowError::IpcError("corrupt exchange record: no length header".into())
            })?;
            let (message, body_start) = message(bytes)?;
            let body = all.slice(header + body_start);
            batch(message, &body, schema)
        }
    }
}

/// The record's message and where its body starts.
fn message(bytes: &[u8]) -> Result<(Message<'_>, usize), ArrowError> {
    let corrupt = |what: &str| ArrowError::IpcError(format!("corrupt exchange record: {what}"));
    if bytes.len() < 4 {
        return Err(corrupt("shorter than its header"));
    }
    let meta_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    let meta = bytes
        .get(4..4 + meta_len)
        .ok_or_else(|| corrupt("metadata longer than the record"))?;
    let message = root_as_message(meta).map_err(|e| corrupt(&e.to_string()))?;
    Ok((message, 4 + meta_len))
}

fn batch(
    message: Message<'_>,
    body: &Buffer,
    schema: &SchemaRef,
) -> Result<RecordBatch, ArrowError> {
    let header = message.header_as_record_batch().ok_or_else(|| {
        ArrowError::IpcError("corrupt exchange record: not a record batch message".into())
    })?;
    let no_dictionaries = HashMap::new();
    let version = message.version();
    let mut trusted = UnsafeFlag::new();
    // SAFETY: an exchange record was encoded by `IpcEncoder` from a valid
    // batch, in a task of the same job, and reached this task through the
    // network layer's length- and sequence-checked frames. What corruption
    // could still break (buffer sizes, string offsets and view bounds) is
    // checked by `check_layout` before any value is read; what is left
    // unchecked, the UTF-8 of each string, is the writer's guarantee, as
    // for DataFusion's own spill files. Full validation spent more time on
    // UTF-8 than the rest of the decoding.
    unsafe { trusted.set(true) };
    let batch =
        RecordBatchDecoder::try_new(body, header, Arc::clone(schema), &no_dictionaries, &version)?
            .with_require_alignment(false)
            .with_skip_validation(trusted)
            .read_record_batch()?;
    for column in batch.columns() {
        check_layout(&column.to_data())
            .map_err(|e| ArrowError::IpcError(format!("corrupt exchange record: {e}")))?;
    }
    Ok(batch)
}

/// Whether `data` can be read without reading out of bounds: buffer sizes
/// (`validate`), string offsets in order, string views inside their
/// buffers. Types exchanges rarely carry are validated in full.
fn check_layout(data: &ArrayData) -> Result<(), ArrowError> {
    data.validate()?;
    match data.data_type() {
        DataType::Utf8View | DataType::BinaryView => {
            let views = data.buffer::<u128>(0);
            validate_binary_view(&views[..data.len()], &data.buffers()[1..])
        }
        DataType::Utf8 | DataType::Binary => offsets_in_order(data.buffer::<i32>(0), data.len()),
        DataType::LargeUtf8 | DataType::LargeBinary => {
            offsets_in_order(data.buffer::<i64>(0), data.len())
        }
        t if t.is_primitive() || matches!(t, DataType::Boolean | DataType::Null) => Ok(()),
        _ => data.validate_full(),
    }
}

/// The `len + 1` offsets of a string column never decrease (`validate`
/// checked the first and last against the values).
fn offsets_in_order<T: PartialOrd + Copy>(offsets: &[T], len: usize) -> Result<(), ArrowError> {
    let offsets = offsets
        .get(..=len)
        .ok_or_else(|| ArrowError::InvalidArgumentError("string offsets missing".into()))?;
    if offsets.windows(2).all(|w| w[0] <= w[1]) {
        Ok(())
    } else {
        Err(ArrowError::InvalidArgumentError(
            "string offsets out of order".into(),
        ))
    }
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

    /// Batches cross the network's buffers as a header and a body written
    /// one after the other; a record gathered from several buffers is read
    /// in place, its columns aligned, and equals the batch written.
    #[test]
    fn records_gathered_from_several_buffers_are_read_in_place_and_aligned() {
        use fluvia_network::{
            BufferOrEvent, CancelToken, NetworkBufferPool, PartitionWriter, RecordBytes,
            RecordDeserializer, ResultPartition, Target,
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("m", DataType::Decimal128(17, 2), true),
            Field::new("v", DataType::Utf8View, true),
        ]));
        let rows = 5000i64;
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter(
                    (0..rows).map(|i| (i % 7 != 0).then_some(i)),
                )),
                Arc::new(
                    Decimal128Array::from_iter_values((0..rows).map(|i| i as i128 * 101))
                        .with_precision_and_scale(17, 2)
                        .unwrap(),
                ),
                Arc::new(StringViewArray::from_iter_values(
                    (0..rows).map(|i| format!("value number {i} of the batch")),
                )),
            ],
        )
        .unwrap();
        let segment = 4096;
        let global = NetworkBufferPool::new(1 << 26, segment).unwrap();
        let pool = global.create_local_pool(4096).unwrap();
        let partition = Arc::new(ResultPartition::pipelined("p", 1, segment));
        let mut w = PartitionWriter::new(Arc::clone(&partition), pool, CancelToken::new(), None);
        let mut enc = IpcEncoder::default();
        for b in [batch.slice(0, 1), batch.clone(), batch.slice(17, 3000)] {
            let parts = enc.encode_parts(&b).unwrap();
            w.emit_parts(Target::One(0), &parts).unwrap();
        }
        w.finish().unwrap();
        let mut d = RecordDeserializer::new();
        let (mut back, mut in_place) = (Vec::new(), 0);
        while let Some((b, _)) = partition.subpartition(0).poll().unwrap() {
            let BufferOrEvent::Buffer(b) = b else { break };
            d.feed_records(b.as_slice(), true, |r| {
                in_place += usize::from(matches!(r, RecordBytes::Reassembled(_)));
                back.push(decode_record(r, &schema).unwrap());
                Ok(())
            })
            .unwrap();
        }
        assert_eq!(in_place, 2, "the two big batches span buffers");
        assert_eq!(
            back,
            vec![batch.slice(0, 1), batch.clone(), batch.slice(17, 3000)]
        );
        for b in &back {
            let m = b
                .column(1)
                .as_any()
                .downcast_ref::<Decimal128Array>()
                .unwrap();
            assert_eq!(m.values().inner().as_ptr() as usize % 16, 0);
        }
    }

    /// 2.25 GiB of strings in one batch, generated from one shared 1 MiB
    /// block (views), crosses as records below the limit and arrives whole.
    #[test]
    fn a_batch_past_2_gib_of_strings_crosses_in_pieces() {
        use datafusion::arrow::array::StringViewBuilder;
        const MIB: usize = 1 << 20;
        let rows = 2304; // × 1 MiB
        let mut b = StringViewBuilder::new();
        let block = b.append_block(Buffer::from(vec![b'x'; MIB]));
        for i in 0..rows {
            // Values of different lengths, all views into the block.
            b.try_append_view(block, 0, (MIB - i) as u32).unwrap();
        }
        let strings = b.finish();
        let logical: usize = strings.total_bytes_len();
        assert!(logical > (2 << 30) + (200 << 20), "{logical}");
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int64, false),
            Field::new("s", DataType::Utf8View, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(Int64Array::from_iter_values(0..rows as i64)),
                Arc::new(strings),
            ],
        )
        .unwrap();
        let mut enc = IpcEncoder::default();
        let (mut rows_back, mut bytes_back, mut records) = (0, 0, 0);
        for piece in exchange_pieces(&batch) {
            let bytes = enc.encode(&piece).unwrap();
            assert!(
                bytes.len() <= MAX_EXCHANGE_BATCH_BYTES + MIB,
                "{}",
                bytes.len()
            );
            let back = decode(bytes, &schema).unwrap();
            let s = back
                .column(1)
                .as_any()
                .downcast_ref::<StringViewArray>()
                .unwrap();
            let first = back
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0);
            assert_eq!(first as usize, rows_back, "pieces in order");
            assert_eq!(s.value(0).len(), MIB - rows_back);
            rows_back += back.num_rows();
            bytes_back += s.total_bytes_len();
            records += 1;
        }
        assert_eq!(rows_back, rows);
        assert_eq!(bytes_back, logical, "every byte arrived");
        assert!(records >= 36, "{records} records");
    }

    /// Records are decoded without checking each string's UTF-8, but a
    /// corrupt layout is still an error, never read out of bounds.
    #[test]
    fn a_string_pointing_outside_its_record_is_an_error() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Utf8View, false),
            Field::new("s", DataType::Utf8, false),
        ]));
        let long = "a string longer than twelve bytes";
        let views = StringViewArray::from(vec![long, long]);
        // As the encoder ships it (compacted).
        let view = views.gc().views()[0].to_le_bytes();
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(views),
                Arc::new(StringArray::from(vec!["abcde", "fghij"])),
            ],
        )
        .unwrap();
        let good = IpcEncoder::default().encode(&batch).unwrap().to_vec();
        assert_eq!(decode(&good, &schema).unwrap(), batch);
        let find = |needle: &[u8]| {
            good.windows(needle.len())
                .position(|w| w == needle)
                .expect("the bytes are in the record")
        };
        // The first view's offset (its last four bytes) past its buffer.
        let mut bad_view = good.clone();
        let at = find(&view) + 12;
        bad_view[at..at + 4].copy_from_slice(&1_000_000u32.to_le_bytes());
        let e = decode(&bad_view, &schema).unwrap_err().to_string();
        assert!(e.contains("corrupt exchange record"), "{e}");
        // The Utf8 offsets 0, 5, 10 as 0, 12, 10: in bounds, out of order.
        let offsets: Vec<u8> = [0i32, 5, 10].iter().flat_map(|o| o.to_le_bytes()).collect();
        let mut bad_offsets = good.clone();
        let at = find(&offsets) + 4;
        bad_offsets[at..at + 4].copy_from_slice(&12i32.to_le_bytes());
        let e = decode(&bad_offsets, &schema).unwrap_err().to_string();
        assert!(e.contains("out of order"), "{e}");
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
