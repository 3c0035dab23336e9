//! Where a read's fields are: the plain reader (64-byte blocks, every
//! field start stored) and the careful one (csv-core's rules, quotes and
//! carriage returns). Knows bytes and rows, not Arrow types.

use super::{RAW, Reading, SKIP, csv_error};
use datafusion::common::{DataFusionError, Result};

/// Where the fields of a read's rows are.
pub(super) enum Fields {
    /// Rows without quotes: the start of every field, row after row
    /// (`columns` per row), and one past the last row. A field ends one byte
    /// before the next starts.
    Flat { starts: Vec<u32>, columns: usize },
    /// Rows with quotes: per parsed slot, the start and end of each row's
    /// field (`end | RAW` when it needs unquoting).
    Bounds(Vec<Vec<u32>>),
}

/// Splits the whole rows of `buf` (which starts at a row) into fields, up
/// to the first row starting at or after `stop`. Returns the fields, the
/// rows, the bytes consumed (whole rows) and whether `stop` was reached.
/// `starts` is a buffer to reuse.
pub(super) fn tokenize(
    buf: &[u8],
    r: &Reading,
    stop: usize,
    lines: usize,
    starts: &mut Vec<u32>,
) -> Result<(Fields, usize, usize, bool)> {
    if buf.len() >= RAW as usize {
        return Err(csv_error("a read buffer of 2 GiB or more".into()));
    }
    let whole = memchr::memrchr(b'\n', buf).map_or(0, |i| i + 1);
    let mut flat = std::mem::take(starts);
    let plain = tokenize_plain(&buf[..whole], r.delimiter, r.quote, r.columns, &mut flat);
    if let Some(rows) = plain {
        // The rows that start before `stop`: all of them but in a range's
        // last read.
        let n = r.columns;
        let row_start = |row: usize| flat[row * n] as usize;
        let kept = if rows == 0 || row_start(rows - 1) < stop {
            rows
        } else {
            let (mut lo, mut hi) = (0, rows - 1);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if row_start(mid) < stop {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        let consumed = if kept < rows { row_start(kept) } else { whole };
        let done = kept < rows || consumed >= stop;
        let fields = Fields::Flat {
            starts: flat,
            columns: n,
        };
        return Ok((fields, kept, consumed, done));
    }
    // Quotes, carriage returns, empty lines or a row with another number
    // of fields: the careful reader reads the one, skips the other and names
    // the last.
    *starts = flat;
    let mut bounds = vec![Vec::new(); r.parsed.len()];
    let (count, consumed, done) = tokenize_quoted(buf, r, stop, lines, &mut bounds)?;
    Ok((Fields::Bounds(bounds), count, consumed, done))
}

fn wrong_fields(line: usize, expected: usize, got: usize) -> DataFusionError {
    csv_error(format!(
        "incorrect number of fields for line {line}, expected {expected} got {got}"
    ))
}

/// Masks of a block: delimiters and line feeds, line feeds, and quotes and
/// carriage returns (which the plain reader leaves to the careful one).
#[cfg(target_arch = "x86_64")]
pub(super) fn classify(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    #[target_feature(enable = "sse2")]
    fn sse2(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
        let d = _mm_set1_epi8(delimiter as i8);
        let n = _mm_set1_epi8(b'\n' as i8);
        let q = _mm_set1_epi8(quote as i8);
        let cr = _mm_set1_epi8(b'\r' as i8);
        let (mut any, mut lines, mut special) = (0u64, 0u64, 0u64);
        for (i, lane) in block.chunks_exact(16).enumerate() {
            // SAFETY: `lane` is 16 readable bytes; the load is unaligned.
            let v = unsafe { _mm_loadu_si128(lane.as_ptr().cast::<__m128i>()) };
            let nl = _mm_cmpeq_epi8(v, n);
            let hit = _mm_or_si128(_mm_cmpeq_epi8(v, d), nl);
            let odd = _mm_or_si128(_mm_cmpeq_epi8(v, q), _mm_cmpeq_epi8(v, cr));
            any |= u64::from(_mm_movemask_epi8(hit) as u16) << (16 * i);
            lines |= u64::from(_mm_movemask_epi8(nl) as u16) << (16 * i);
            special |= u64::from(_mm_movemask_epi8(odd) as u16) << (16 * i);
        }
        (any, lines, special)
    }
    // SAFETY: SSE2 is part of every x86_64 target.
    unsafe { sse2(block, delimiter, quote) }
}

#[cfg(not(target_arch = "x86_64"))]
pub(super) fn classify(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
    classify_scalar(block, delimiter, quote)
}

#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(super) fn classify_scalar(block: &[u8; 64], delimiter: u8, quote: u8) -> (u64, u64, u64) {
    block
        .iter()
        .enumerate()
        .fold((0, 0, 0), |(any, lines, special), (i, &b)| {
            (
                any | (u64::from(b == delimiter || b == b'\n') << i),
                lines | (u64::from(b == b'\n') << i),
                special | (u64::from(b == quote || b == b'\r') << i),
            )
        })
}

/// Rows without quotes or carriage returns, `buf` ending at a line end:
/// every delimiter ends a field and every line feed a row. Fills `starts`
/// (see [`Fields::Flat`]; its length only grows, so it is reused without
/// zeroing) and returns the rows, or `None` unless every row has `columns`
/// fields and the rows hold no quote or carriage return.
fn tokenize_plain(
    buf: &[u8],
    delimiter: u8,
    quote: u8,
    columns: usize,
    starts: &mut Vec<u32>,
) -> Option<usize> {
    if columns == 0 {
        return None;
    }
    if starts.is_empty() {
        starts.resize(64 << 10, 0);
    }
    starts[0] = 0;
    // `out[k]` is where the field after the k-th separator starts; the
    // separator stored at `row_end` must end a row.
    let mut k = 1usize;
    let mut row_end = columns;
    let (mut rows, mut line_ends) = (0usize, 0usize);
    let mut base = 0usize;
    let mut tail;
    while base < buf.len() {
        // Room for a block's separators; grown rarely, never zeroed again.
        if k + 64 >= starts.len() {
            let more = starts.len().max(k + 65);
            starts.resize(starts.len() + more, 0);
        }
        let out = &mut starts[..];
        let n = (buf.len() - base).min(64);
        let block: &[u8; 64] = match buf[base..].first_chunk::<64>() {
            Some(b) => b,
            None => {
                tail = [0u8; 64];
                tail[..n].copy_from_slice(&buf[base..]);
                &tail
            }
        };
        let (mut any, mut lines, mut special) = classify(block, delimiter, quote);
        if n < 64 {
            let valid = (1u64 << n) - 1;
            any &= valid;
            lines &= valid;
            special &= valid;
        }
        if special != 0 {
            return None;
        }
        // Line feeds are sparse: cheaper than a population count without
        // the POPCNT instruction.
        while lines != 0 {
            line_ends += 1;
            lines &= lines - 1;
        }
        while any != 0 {
            let p = base + any.trailing_zeros() as usize;
            any &= any - 1;
            out[k] = (p + 1) as u32;
            if k == row_end {
                if buf[p] != b'\n' {
                    return None;
                }
                rows += 1;
                row_end += columns;
            }
            k += 1;
        }
        base += 64;
    }
    // Every row's last separator is a line feed and there are no others.
    (line_ends == rows && k == rows * columns + 1).then_some(rows)
}

/// Drops the fields recorded for the unfinished row (its first `col`).
fn rollback(bounds: &mut [Vec<u32>], r: &Reading, rows: usize, col: usize) {
    for &s in r.slot.iter().take(col) {
        if s != SKIP {
            bounds[s as usize].truncate(2 * rows);
        }
    }
}

/// Rows with quotes or carriage returns, with csv-core's rules: a quote
/// opens a quoted field only at its start, `""` inside one is a quote, a
/// line feed or carriage return ends a row (`\r\n` once), empty lines are
/// skipped.
fn tokenize_quoted(
    buf: &[u8],
    r: &Reading,
    stop: usize,
    lines: usize,
    bounds: &mut [Vec<u32>],
) -> Result<(usize, usize, bool)> {
    let mut count = 0usize;
    #[derive(Clone, Copy, PartialEq)]
    enum State {
        StartRecord,
        StartField,
        InField,
        InQuoted,
        QuoteInQuoted,
    }
    let (d, q) = (r.delimiter, r.quote);
    let mut state = State::StartRecord;
    let mut col = 0usize;
    let mut field_start = 0usize;
    let mut row_start = 0usize;
    // The field was quoted: simple (content between the quotes) or raw.
    let mut quoted = false;
    let mut raw = false;
    if stop == 0 {
        return Ok((0, 0, true));
    }
    let mut i = 0usize;
    while i < buf.len() {
        let c = buf[i];
        let term = c == b'\n' || c == b'\r';
        match state {
            State::StartRecord => {
                if term {
                    i += 1;
                    row_start = i;
                    continue;
                }
                if row_start >= stop {
                    return Ok((count, row_start, true));
                }
                state = State::StartField;
                continue;
            }
            State::StartField => {
                field_start = i;
                quoted = false;
                raw = false;
                if c == q {
                    quoted = true;
                    state = State::InQuoted;
                    i += 1;
                    continue;
                }
                state = State::InField;
                continue;
            }
            State::InField => {
                if c != d && !term {
                    if c == q && quoted {
                        raw = true;
                    }
                    i += 1;
                    continue;
                }
            }
            State::InQuoted => {
                if c == q {
                    state = State::QuoteInQuoted;
                }
                i += 1;
                continue;
            }
            State::QuoteInQuoted => {
                if c == q {
                    raw = true;
                    state = State::InQuoted;
                    i += 1;
                    continue;
                }
                if c != d && !term {
                    raw = true;
                    state = State::InField;
                    i += 1;
                    continue;
                }
            }
        }
        // `c` ends the field at `i` (a delimiter or a terminator).
        if let Some(&s) = r.slot.get(col)
            && s != SKIP
        {
            let b = &mut bounds[s as usize];
            if raw {
                b.push(field_start as u32);
                b.push(i as u32 | RAW);
            } else if quoted {
                b.push(field_start as u32 + 1);
                b.push(i as u32 - 1);
            } else {
                b.push(field_start as u32);
                b.push(i as u32);
            }
        }
        col += 1;
        i += 1;
        if term {
            if col != r.columns {
                return Err(wrong_fields(lines + count + 1, r.columns, col));
            }
            count += 1;
            col = 0;
            // `\r\n` is one terminator; a line feed after it is skipped by
            // StartRecord like an empty line.
            row_start = i;
            state = State::StartRecord;
        } else {
            state = State::StartField;
        }
    }
    if state == State::StartRecord {
        // Only terminators after the last row.
        return Ok((count, row_start, row_start >= stop));
    }
    rollback(bounds, r, count, col);
    Ok((count, row_start, false))
}

/// csv-core's reading of a quoted field with doubled quotes or text after
/// its closing quote.
pub(super) fn unquote(raw: &[u8], quote: u8, into: &mut Vec<u8>) {
    into.clear();
    let mut inside = false;
    let mut i = 0;
    if raw.first() == Some(&quote) {
        inside = true;
        i = 1;
    }
    while i < raw.len() {
        let c = raw[i];
        if inside {
            if c == quote {
                if raw.get(i + 1) == Some(&quote) {
                    into.push(quote);
                    i += 2;
                    continue;
                }
                inside = false;
            } else {
                into.push(c);
            }
        } else {
            into.push(c);
        }
        i += 1;
    }
}
