//! A column's values from its fields: fast parsers for integers, decimals
//! and dates, arrow's parsers for the rest, so a value parses or fails as
//! in DataFusion's reader.

use super::fields::{Fields, unquote};
use super::{Column, Kind, RAW, csv_error};
use datafusion::arrow::array::builder::{
    LargeStringBuilder, NullBufferBuilder, StringBuilder, StringViewBuilder,
};
use datafusion::arrow::array::{ArrayRef, PrimitiveArray};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int8Type, Int16Type,
    Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::arrow::error::ArrowError;
use datafusion::common::{DataFusionError, Result};
use std::sync::Arc;

/// What a column's values are parsed from.
pub(super) struct Values<'a> {
    pub(super) buf: &'a [u8],
    pub(super) fields: &'a Fields,
    pub(super) slot: usize,
    pub(super) quote: u8,
    pub(super) column: &'a Column,
    /// Rows before this batch, for messages.
    pub(super) line: usize,
}

impl Values<'_> {
    fn text<'s>(&self, f: &'s [u8], row: usize) -> Result<&'s str> {
        std::str::from_utf8(f).map_err(|_| {
            csv_error(format!(
                "Encountered invalid UTF-8 data for line {} and field {}",
                self.line + row + 1,
                self.column.index + 1
            ))
        })
    }

    fn parse_error(&self, s: &str, row: usize) -> DataFusionError {
        DataFusionError::ArrowError(
            Box::new(ArrowError::ParseError(format!(
                "Error while parsing value '{s}' as type '{}' for column {} at line {}",
                self.column.field.data_type(),
                self.column.index,
                self.line + row
            ))),
            None,
        )
    }

    fn primitive<T>(
        &self,
        rows: &[u32],
        fast: impl Fn(&[u8]) -> Option<T::Native>,
        slow: impl Fn(&str) -> Option<T::Native>,
    ) -> Result<ArrayRef>
    where
        T: ArrowPrimitiveType,
    {
        let mut values = Vec::with_capacity(rows.len());
        let mut nulls = NullBufferBuilder::new(rows.len());
        self.each_field(rows, |row, f| {
            if f.is_empty() {
                values.push(T::Native::default());
                nulls.append_null();
                return Ok(());
            }
            let v = match fast(f) {
                Some(v) => v,
                None => {
                    let s = self.text(f, row)?;
                    slow(s).ok_or_else(|| self.parse_error(s, row))?
                }
            };
            values.push(v);
            nulls.append_non_null();
            Ok(())
        })?;
        let array = PrimitiveArray::<T>::new(values.into(), nulls.finish())
            .with_data_type(self.column.field.data_type().clone());
        Ok(Arc::new(array))
    }

    pub(super) fn build(&self, rows: &[u32]) -> Result<ArrayRef> {
        use datafusion::arrow::compute::kernels::cast_utils::Parser;
        macro_rules! int {
            ($t:ty, $native:ty) => {
                self.primitive::<$t>(
                    rows,
                    |b| parse_int(b).and_then(|v| <$native>::try_from(v).ok()),
                    <$t>::parse,
                )
            };
        }
        match self.column.kind {
            Kind::Int8 => int!(Int8Type, i8),
            Kind::Int16 => int!(Int16Type, i16),
            Kind::Int32 => int!(Int32Type, i32),
            Kind::Int64 => int!(Int64Type, i64),
            Kind::UInt8 => int!(UInt8Type, u8),
            Kind::UInt16 => int!(UInt16Type, u16),
            Kind::UInt32 => int!(UInt32Type, u32),
            Kind::UInt64 => int!(UInt64Type, u64),
            Kind::Float32 => self.primitive::<Float32Type>(rows, |_| None, Float32Type::parse),
            Kind::Float64 => self.primitive::<Float64Type>(rows, |_| None, Float64Type::parse),
            Kind::Date32 => self.primitive::<Date32Type>(rows, parse_date, Date32Type::parse),
            Kind::Decimal128(p, s) => self.primitive::<Decimal128Type>(
                rows,
                |b| parse_decimal(b, p, s),
                |t| {
                    datafusion::arrow::compute::kernels::cast_utils::parse_decimal::<
                            Decimal128Type,
                        >(t, p, s)
                        .ok()
                },
            ),
            Kind::Utf8View => {
                let mut b = StringViewBuilder::with_capacity(rows.len());
                self.strings(rows, |s| match s {
                    Some(s) => b.append_value(s),
                    None => b.append_null(),
                })?;
                Ok(Arc::new(b.finish()))
            }
            Kind::Utf8 => {
                let mut b = StringBuilder::with_capacity(rows.len(), rows.len() * 16);
                self.strings(rows, |s| b.append_option(s))?;
                Ok(Arc::new(b.finish()))
            }
            Kind::LargeUtf8 => {
                let mut b = LargeStringBuilder::with_capacity(rows.len(), rows.len() * 16);
                self.strings(rows, |s| b.append_option(s))?;
                Ok(Arc::new(b.finish()))
            }
        }
    }

    fn strings(&self, rows: &[u32], mut append: impl FnMut(Option<&str>)) -> Result<()> {
        self.each_field(rows, |row, f| {
            if f.is_empty() {
                append(None);
            } else {
                append(Some(self.text(f, row)?));
            }
            Ok(())
        })
    }

    /// Calls `f` with each row of `rows` and the text of its field; the
    /// layout is matched once, outside the loop.
    fn each_field(
        &self,
        rows: &[u32],
        mut f: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<()> {
        match self.fields {
            Fields::Flat { starts, columns } => {
                let c = self.column.index;
                for &row in rows {
                    let j = row as usize * columns + c;
                    let (start, end) = (starts[j] as usize, starts[j + 1] as usize - 1);
                    f(row as usize, &self.buf[start..end])?;
                }
            }
            Fields::Bounds(bounds) => {
                let bounds = &bounds[self.slot];
                let mut scratch = Vec::new();
                for &row in rows {
                    let row = row as usize;
                    let start = bounds[2 * row] as usize;
                    let end = bounds[2 * row + 1];
                    if end & RAW != 0 {
                        unquote(
                            &self.buf[start..(end & !RAW) as usize],
                            self.quote,
                            &mut scratch,
                        );
                        f(row, &scratch)?;
                    } else {
                        f(row, &self.buf[start..end as usize])?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// `-?[0-9]{1,18}`; anything else goes to arrow's parser.
pub(super) fn parse_int(b: &[u8]) -> Option<i64> {
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    if digits.is_empty() || digits.len() > 18 {
        return None;
    }
    let mut v: i64 = 0;
    for &c in digits {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + i64::from(d);
    }
    Some(if negative { -v } else { v })
}

/// `-?[0-9]+(\.[0-9]+)?` with at most `scale` decimals, `precision -
/// scale` integer digits and 18 digits in all; anything else goes to
/// arrow's parser.
pub(super) fn parse_decimal(b: &[u8], precision: u8, scale: i8) -> Option<i128> {
    let scale = u32::try_from(scale).ok()?;
    let (negative, digits) = match b.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, b),
    };
    let mut v: i64 = 0;
    let mut int_digits = 0u32;
    let mut decimals: Option<u32> = None;
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    for &c in digits {
        if c == b'.' {
            if decimals.is_some() || int_digits == 0 {
                return None;
            }
            decimals = Some(0);
            continue;
        }
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v.wrapping_mul(10).wrapping_add(i64::from(d));
        match &mut decimals {
            Some(n) => *n += 1,
            None => int_digits += 1,
        }
    }
    let decimals = match decimals {
        Some(0) => return None,
        Some(n) => n,
        None => 0,
    };
    if int_digits == 0
        || int_digits + decimals > 18
        || decimals > scale
        || int_digits + scale > u32::from(precision)
    {
        return None;
    }
    let v = i128::from(v) * 10i128.pow(scale - decimals);
    Some(if negative { -v } else { v })
}

/// `YYYY-MM-DD` as days since 1970-01-01; anything else goes to arrow's
/// parser.
pub(super) fn parse_date(b: &[u8]) -> Option<i32> {
    let b: &[u8; 10] = b.try_into().ok()?;
    if b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let num = |s: &[u8]| -> Option<i32> {
        s.iter().try_fold(0i32, |v, &c| {
            let d = c.wrapping_sub(b'0');
            (d <= 9).then_some(v * 10 + i32::from(d))
        })
    };
    let (y, m, d) = (num(&b[..4])?, num(&b[5..7])?, num(&b[8..])?);
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days_in_month = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return None,
    };
    if d < 1 || d > days_in_month {
        return None;
    }
    // Days from the civil date (proleptic Gregorian), March-based years.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    Some(era * 146_097 + doe - 719_468)
}
