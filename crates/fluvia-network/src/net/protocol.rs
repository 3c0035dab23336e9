//! The wire protocol between TaskManagers, shaped after Flink's
//! `NettyMessage`.
//!
//! Every frame is `u32 length | u32 magic 0xBADC0FFE | u8 message id | body`,
//! big-endian, where `length` counts everything after itself. The decoder is
//! incremental (frames may arrive in any fragmentation) and total: any byte
//! sequence yields messages or a [`ProtocolError`], never a panic and never an
//! allocation larger than [`MAX_FRAME`].

use crate::byte_reader::{ByteReader, Truncation, decode_error};
use std::fmt;

pub const MAGIC: u32 = 0xBADC_0FFE;
/// Largest frame accepted: a buffer payload of up to 16 MiB plus headers.
pub const MAX_FRAME: usize = 16 * 1024 * 1024 + 1024;
const HEADER: usize = 4 + 4 + 1;

/// Identifies one produced partition: data set, producing subtask, attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResultPartitionId {
    pub data_set: u128,
    pub producer_subtask: u32,
    pub attempt: u32,
}

impl fmt::Display for ResultPartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:032x}#{}@{}",
            self.data_set, self.producer_subtask, self.attempt
        )
    }
}

/// Identifies one consuming input channel on a connection.
pub type ReceiverId = u128;

/// What a BufferResponse carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    /// A buffer of framed records; costs one credit.
    Data = 0,
    /// The subpartition ended; free of credit.
    EndOfPartition = 1,
    /// An event in order with the data ([`crate::Event`]'s byte form);
    /// free of credit.
    Event = 2,
    /// A priority event (an unaligned checkpoint barrier): the receiver
    /// queues it ahead of the buffers it has not handed out; free of credit.
    PriorityEvent = 3,
}

/// What precedes the payload of a BufferResponse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferHeader {
    pub receiver: ReceiverId,
    pub subpartition: u32,
    pub sequence: u32,
    pub backlog: u32,
    pub data_type: DataType,
    pub compressed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// id 0, server → client.
    BufferResponse {
        header: BufferHeader,
        payload: Vec<u8>,
    },
    /// id 1, server → client: a failure of one channel, or of the whole
    /// connection when `receiver` is `None`.
    ErrorResponse {
        receiver: Option<ReceiverId>,
        message: String,
    },
    /// id 2, client → server.
    PartitionRequest {
        partition: ResultPartitionId,
        first_subpartition: u32,
        last_subpartition: u32,
        receiver: ReceiverId,
        initial_credit: u32,
    },
    /// id 4, client → server.
    CancelPartitionRequest { receiver: ReceiverId },
    /// id 5, client → server: the client closes the connection.
    CloseRequest,
    /// id 6, client → server.
    AddCredit { receiver: ReceiverId, credit: u32 },
    /// id 7, client → server, first on every connection: the cluster secret
    /// (empty when the cluster has none).
    Hello { secret: String },
    /// id 8, client → server: the consumer polled the channel for the first
    /// time; a producer that waits for demand before it starts may go.
    ConsumerDemand { receiver: ReceiverId },
}

impl Message {
    pub fn id(&self) -> u8 {
        match self {
            Message::BufferResponse { .. } => 0,
            Message::ErrorResponse { .. } => 1,
            Message::PartitionRequest { .. } => 2,
            Message::CancelPartitionRequest { .. } => 4,
            Message::CloseRequest => 5,
            Message::AddCredit { .. } => 6,
            Message::Hello { .. } => 7,
            Message::ConsumerDemand { .. } => 8,
        }
    }
}

decode_error!(
    /// A malformed frame.
    ProtocolError,
    "protocol error"
);

fn begin(out: &mut Vec<u8>, id: u8) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.push(id);
    start
}

fn end(out: &mut [u8], start: usize) {
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Writes the header of a BufferResponse whose `payload_len` bytes follow;
/// lets the sender write the payload from its own buffer without a copy.
pub fn encode_buffer_response_header(out: &mut Vec<u8>, header: &BufferHeader, payload_len: usize) {
    let body = 16 + 4 + 4 + 4 + 1 + 1 + 4;
    let len = (4 + 1 + body + payload_len) as u32;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.push(0);
    out.extend_from_slice(&header.receiver.to_be_bytes());
    out.extend_from_slice(&header.subpartition.to_be_bytes());
    out.extend_from_slice(&header.sequence.to_be_bytes());
    out.extend_from_slice(&header.backlog.to_be_bytes());
    out.push(header.data_type as u8);
    out.push(header.compressed as u8);
    out.extend_from_slice(&(payload_len as u32).to_be_bytes());
}

/// Appends the frame of `msg` to `out`.
pub fn encode(msg: &Message, out: &mut Vec<u8>) {
    match msg {
        Message::BufferResponse { header, payload } => {
            encode_buffer_response_header(out, header, payload.len());
            out.extend_from_slice(payload);
        }
        Message::ErrorResponse { receiver, message } => {
            let s = begin(out, 1);
            match receiver {
                Some(r) => {
                    out.push(1);
                    out.extend_from_slice(&r.to_be_bytes());
                }
                None => out.push(0),
            }
            out.extend_from_slice(&(message.len() as u32).to_be_bytes());
            out.extend_from_slice(message.as_bytes());
            end(out, s);
        }
        Message::PartitionRequest {
            partition,
            first_subpartition,
            last_subpartition,
            receiver,
            initial_credit,
        } => {
            let s = begin(out, 2);
            out.extend_from_slice(&partition.data_set.to_be_bytes());
            out.extend_from_slice(&partition.producer_subtask.to_be_bytes());
            out.extend_from_slice(&partition.attempt.to_be_bytes());
            out.extend_from_slice(&first_subpartition.to_be_bytes());
            out.extend_from_slice(&last_subpartition.to_be_bytes());
            out.extend_from_slice(&receiver.to_be_bytes());
            out.extend_from_slice(&initial_credit.to_be_bytes());
            end(out, s);
        }
        Message::CancelPartitionRequest { receiver } => {
            let s = begin(out, 4);
            out.extend_from_slice(&receiver.to_be_bytes());
            end(out, s);
        }
        Message::CloseRequest => {
            let s = begin(out, 5);
            end(out, s);
        }
        Message::AddCredit { receiver, credit } => {
            let s = begin(out, 6);
            out.extend_from_slice(&credit.to_be_bytes());
            out.extend_from_slice(&receiver.to_be_bytes());
            end(out, s);
        }
        Message::Hello { secret } => {
            let s = begin(out, 7);
            out.extend_from_slice(&(secret.len() as u32).to_be_bytes());
            out.extend_from_slice(secret.as_bytes());
            end(out, s);
        }
        Message::ConsumerDemand { receiver } => {
            let s = begin(out, 8);
            out.extend_from_slice(&receiver.to_be_bytes());
            end(out, s);
        }
    }
}

/// Names the frame a truncated body belongs to.
struct FrameKind(&'static str);

impl Truncation for FrameKind {
    type Error = ProtocolError;
    fn truncated(&self, needed: usize, at: usize, has: usize) -> ProtocolError {
        ProtocolError(format!(
            "{} frame truncated: needs {needed} more bytes at offset {at}, has {has}",
            self.0
        ))
    }
    fn invalid(&self, message: String, _at: usize) -> ProtocolError {
        ProtocolError(message)
    }
}

/// Reads fields from a frame body, failing on truncation.
type Reader<'a> = ByteReader<'a, FrameKind>;

impl Reader<'_> {
    fn finish(&self) -> Result<(), ProtocolError> {
        if self.remaining() == 0 {
            Ok(())
        } else {
            Err(ProtocolError(format!(
                "{} frame has {} trailing bytes",
                self.context.0,
                self.remaining()
            )))
        }
    }
}

/// A decoded frame. Data buffers borrow their payload from the decoder, so
/// the receiver copies it once, straight into its own segment.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Buffer {
        header: BufferHeader,
        payload: &'a [u8],
    },
    Message(Message),
}

impl Frame<'_> {
    pub fn into_message(self) -> Message {
        match self {
            Frame::Buffer { header, payload } => Message::BufferResponse {
                header,
                payload: payload.to_vec(),
            },
            Frame::Message(m) => m,
        }
    }
}

/// Decodes one frame body (after length and magic) with message id `id`.
fn decode_frame(id: u8, body: &[u8]) -> Result<Frame<'_>, ProtocolError> {
    let what = match id {
        0 => "BufferResponse",
        1 => "ErrorResponse",
        2 => "PartitionRequest",
        4 => "CancelPartitionRequest",
        5 => "CloseRequest",
        6 => "AddCredit",
        7 => "Hello",
        8 => "ConsumerDemand",
        other => return Err(ProtocolError(format!("unknown message id {other}"))),
    };
    let mut r = Reader::new(body, FrameKind(what));
    let msg = match id {
        0 => {
            // Fields in wire order: a struct literal evaluates in the order written.
            let header = BufferHeader {
                receiver: r.u128()?,
                subpartition: r.u32()?,
                sequence: r.u32()?,
                backlog: r.u32()?,
                data_type: r.one_of(
                    &[
                        DataType::Data,
                        DataType::EndOfPartition,
                        DataType::Event,
                        DataType::PriorityEvent,
                    ],
                    "unknown buffer data type",
                )?,
                compressed: r.one_of(&[false, true], "invalid compressed flag")?,
            };
            let size = r.u32()? as usize;
            let payload = r.take(size)?;
            r.finish()?;
            return Ok(Frame::Buffer { header, payload });
        }
        1 => {
            let receiver = match r.u8()? {
                0 => None,
                1 => Some(r.u128()?),
                f => return Err(ProtocolError(format!("invalid receiver flag {f}"))),
            };
            let len = r.u32()? as usize;
            let message = String::from_utf8(r.take(len)?.to_vec())
                .map_err(|_| ProtocolError("error message is not UTF-8".into()))?;
            Message::ErrorResponse { receiver, message }
        }
        2 => {
            let data_set = r.u128()?;
            let producer_subtask = r.u32()?;
            let attempt = r.u32()?;
            let first_subpartition = r.u32()?;
            let last_subpartition = r.u32()?;
            if last_subpartition < first_subpartition {
                return Err(ProtocolError(format!(
                    "empty subpartition range {first_subpartition}..={last_subpartition}"
                )));
            }
            Message::PartitionRequest {
                partition: ResultPartitionId {
                    data_set,
                    producer_subtask,
                    attempt,
                },
                first_subpartition,
                last_subpartition,
                receiver: r.u128()?,
                initial_credit: r.u32()?,
            }
        }
        4 => Message::CancelPartitionRequest {
            receiver: r.u128()?,
        },
        5 => Message::CloseRequest,
        7 => {
            let len = r.u32()? as usize;
            let secret = String::from_utf8(r.take(len)?.to_vec())
                .map_err(|_| ProtocolError("hello secret is not UTF-8".into()))?;
            Message::Hello { secret }
        }
        8 => Message::ConsumerDemand {
            receiver: r.u128()?,
        },
        _ => {
            let credit = r.u32()?;
            if credit == 0 {
                return Err(ProtocolError("AddCredit with zero credit".into()));
            }
            Message::AddCredit {
                credit,
                receiver: r.u128()?,
            }
        }
    };
    r.finish()?;
    Ok(Frame::Message(msg))
}

/// Incremental frame decoder: bytes in (from a reader or fed), frames out.
/// Its buffer is zeroed only when it grows, and consumed frames are
/// compacted away only when space runs out.
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl FrameDecoder {
    /// Initial buffer: room for many 32 KiB buffers per read.
    const INITIAL: usize = 1 << 20;

    pub fn new() -> Self {
        Self::default()
    }

    fn ensure_space(&mut self, n: usize) {
        if self.buf.len() - self.end >= n {
            return;
        }
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < n {
            let want = (self.end + n).max(self.buf.len() * 2).max(Self::INITIAL);
            self.buf.resize(want, 0);
        }
    }

    /// Appends received bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.ensure_space(bytes.len());
        self.buf[self.end..self.end + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Reads once from `r` into free space (at least `min` bytes of it);
    /// returns what `read` returned.
    pub fn read_from(&mut self, r: &mut impl std::io::Read, min: usize) -> std::io::Result<usize> {
        self.read_with(min, |buf| r.read(buf))
    }

    /// Reads once with `read` into free space (at least `min` bytes of
    /// it); returns what `read` returned.
    pub fn read_with(
        &mut self,
        min: usize,
        read: impl FnOnce(&mut [u8]) -> std::io::Result<usize>,
    ) -> std::io::Result<usize> {
        self.ensure_space(min);
        let n = read(&mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// Bytes received and not yet decoded.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// The next complete frame, if any.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, ProtocolError> {
        let avail = &self.buf[self.start..self.end];
        if avail.len() < HEADER {
            return Ok(None);
        }
        let len = u32::from_be_bytes([avail[0], avail[1], avail[2], avail[3]]) as usize;
        if !(5..=MAX_FRAME).contains(&len) {
            return Err(ProtocolError(format!(
                "frame length {len} outside 5..={MAX_FRAME}"
            )));
        }
        let magic = u32::from_be_bytes([avail[4], avail[5], avail[6], avail[7]]);
        if magic != MAGIC {
            return Err(ProtocolError(format!(
                "bad magic number {magic:#010x} (expected {MAGIC:#010x})"
            )));
        }
        if avail.len() < 4 + len {
            return Ok(None);
        }
        let id = avail[8];
        let frame_start = self.start;
        self.start += 4 + len;
        if self.start == self.end {
            // Everything consumed: reuse the buffer from its beginning. The
            // frame borrowed below still reads the bytes it was decoded from.
            let (s, e) = (frame_start + HEADER, frame_start + 4 + len);
            self.start = 0;
            self.end = 0;
            return decode_frame(id, &self.buf[s..e]).map(Some);
        }
        decode_frame(id, &self.buf[frame_start + HEADER..frame_start + 4 + len]).map(Some)
    }

    /// The next complete message (owned), if any.
    pub fn next_message(&mut self) -> Result<Option<Message>, ProtocolError> {
        Ok(self.next_frame()?.map(Frame::into_message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn buffer_response(
        receiver: ReceiverId,
        subpartition: u32,
        sequence: u32,
        backlog: u32,
        data_type: DataType,
        compressed: bool,
        payload: Vec<u8>,
    ) -> Message {
        let header = BufferHeader {
            receiver,
            subpartition,
            sequence,
            backlog,
            data_type,
            compressed,
        };
        Message::BufferResponse { header, payload }
    }

    fn samples() -> Vec<Message> {
        vec![
            buffer_response(7, 1, 42, 3, DataType::Data, true, vec![1, 2, 3]),
            buffer_response(u128::MAX, 0, 0, 0, DataType::EndOfPartition, false, vec![]),
            Message::ErrorResponse {
                receiver: Some(9),
                message: "partition not found".into(),
            },
            Message::ErrorResponse {
                receiver: None,
                message: "ünïcode".into(),
            },
            Message::PartitionRequest {
                partition: ResultPartitionId {
                    data_set: 0xabc,
                    producer_subtask: 3,
                    attempt: 1,
                },
                first_subpartition: 2,
                last_subpartition: 5,
                receiver: 99,
                initial_credit: 2,
            },
            Message::CancelPartitionRequest { receiver: 5 },
            Message::CloseRequest,
            Message::AddCredit {
                receiver: 5,
                credit: 4,
            },
            Message::Hello {
                secret: "s3cret".into(),
            },
            Message::ConsumerDemand { receiver: 7 },
        ]
    }

    #[test]
    fn every_message_round_trips_in_any_fragmentation() {
        let mut wire = Vec::new();
        for m in samples() {
            encode(&m, &mut wire);
        }
        for chunk in [1, 2, 3, 7, 64, wire.len()] {
            let mut d = FrameDecoder::new();
            let mut out = Vec::new();
            for piece in wire.chunks(chunk) {
                d.feed(piece);
                while let Some(m) = d.next_message().unwrap() {
                    out.push(m);
                }
            }
            assert_eq!(out, samples(), "chunk {chunk}");
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn malformed_frames_are_errors() {
        let mut d = FrameDecoder::new();
        d.feed(&[0, 0, 0, 5, 0xde, 0xad, 0xbe, 0xef, 2]);
        assert!(d.next_message().unwrap_err().0.contains("bad magic"));

        let mut d = FrameDecoder::new();
        d.feed(&[0xff, 0xff, 0xff, 0xff, 0xba, 0xdc, 0x0f, 0xfe, 0]);
        assert!(d.next_message().unwrap_err().0.contains("frame length"));

        // An AddCredit frame cut short inside its body.
        let mut wire = Vec::new();
        encode(
            &Message::AddCredit {
                receiver: 1,
                credit: 1,
            },
            &mut wire,
        );
        wire[3] -= 4;
        wire.truncate(wire.len() - 4);
        let mut d = FrameDecoder::new();
        d.feed(&wire);
        assert!(d.next_message().unwrap_err().0.contains("truncated"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut d = FrameDecoder::new();
            d.feed(&bytes);
            for _ in 0..64 {
                match d.next_message() {
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
        }

        #[test]
        fn valid_frames_with_random_corruption_never_panic(
            index in 0usize..9,
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            cut in any::<usize>(),
        ) {
            let mut wire = Vec::new();
            encode(&samples()[index], &mut wire);
            for (pos, byte) in flips {
                let p = pos % wire.len();
                wire[p] ^= byte;
            }
            wire.truncate(cut % (wire.len() + 1));
            let mut d = FrameDecoder::new();
            d.feed(&wire);
            let _ = d.next_message();
        }
    }
}
