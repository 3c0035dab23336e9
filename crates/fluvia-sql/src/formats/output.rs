//! Query results as CSV, in the conventions of the TPC-DS answer files:
//! NULL is an empty field, an empty string is `""`, decimals keep their
//! scale, dates are `YYYY-MM-DD`, and strings are quoted (RFC 4180) when
//! they hold a comma, quote, CR or LF or start or end with whitespace.

use datafusion::arrow::array::Array;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use fluvia_core::{FluviaError, Result};
use std::io::Write;

/// One rendered cell; `None` is NULL.
pub type Cell = Option<String>;

fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// Whether a column holds numbers (compared with a tolerance).
pub fn is_numeric(t: &DataType) -> bool {
    t.is_numeric()
}

/// Renders every row of `batches` as cells.
pub fn render(batches: &[RecordBatch]) -> Result<Vec<Vec<Cell>>> {
    let options = FormatOptions::default().with_null("");
    let mut rows = Vec::new();
    for batch in batches {
        let formatters = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| FluviaError::Internal(format!("formatting the result: {e}")))?;
        for r in 0..batch.num_rows() {
            let row = batch
                .columns()
                .iter()
                .zip(&formatters)
                .map(|(c, f)| {
                    if c.is_null(r) {
                        None
                    } else {
                        Some(f.value(r).to_string())
                    }
                })
                .collect();
            rows.push(row);
        }
    }
    Ok(rows)
}

fn needs_quotes(s: &str) -> bool {
    s.is_empty()
        || s.contains([',', '"', '\r', '\n'])
        || s.starts_with(char::is_whitespace)
        || s.ends_with(char::is_whitespace)
}

/// Writes the result as CSV with a header line.
pub fn write_csv(
    out: &mut impl Write,
    batches: &[RecordBatch],
    schema: &datafusion::arrow::datatypes::Schema,
) -> Result<()> {
    let io = |e| FluviaError::io("writing the result", e);
    let header: Vec<String> = schema
        .fields()
        .iter()
        .map(|f| quote(f.name(), true))
        .collect();
    writeln!(out, "{}", header.join(",")).map_err(io)?;
    let strings: Vec<bool> = schema
        .fields()
        .iter()
        .map(|f| is_string(f.data_type()))
        .collect();
    for row in render(batches)? {
        let line: Vec<String> = row
            .iter()
            .zip(&strings)
            .map(|(c, &s)| match c {
                None => String::new(),
                Some(v) => quote(v, s),
            })
            .collect();
        writeln!(out, "{}", line.join(",")).map_err(io)?;
    }
    out.flush().map_err(io)
}

fn quote(s: &str, string: bool) -> String {
    if string && needs_quotes(s) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Parses CSV text (RFC 4180): an empty unquoted field is NULL.
pub fn parse_csv(text: &str) -> std::result::Result<Vec<Vec<Cell>>, String> {
    let mut rows = Vec::new();
    let mut row: Vec<Cell> = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut in_quotes = false;
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let mut any = false;
    while let Some(c) = chars.next() {
        any = true;
        if in_quotes {
            if c == '"' {
                if chars.peek() == Some(&'"') {
                    chars.next();
                    field.push('"');
                } else {
                    in_quotes = false;
                }
            } else {
                if c == '\n' {
                    line += 1;
                }
                field.push(c);
            }
            continue;
        }
        match c {
            '"' if field.is_empty() && !quoted => {
                quoted = true;
                in_quotes = true;
            }
            ',' => {
                row.push(take(&mut field, &mut quoted));
            }
            '\n' => {
                row.push(take(&mut field, &mut quoted));
                rows.push(std::mem::take(&mut row));
                line += 1;
                any = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            c => field.push(c),
        }
    }
    if in_quotes {
        return Err(format!("line {line}: unterminated quoted field"));
    }
    if any {
        row.push(take(&mut field, &mut quoted));
        rows.push(row);
    }
    Ok(rows)
}

fn take(field: &mut String, quoted: &mut bool) -> Cell {
    let f = std::mem::take(field);
    let was_quoted = std::mem::replace(quoted, false);
    if f.is_empty() && !was_quoted {
        None
    } else {
        Some(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_round_trip_distinguishes_null_and_empty() {
        let text = "a,b,c\n1,,\"\"\n\"x, y\",\"q\"\"\",z\n";
        let rows = parse_csv(text).unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1], vec![Some("1".into()), None, Some("".into())]);
        assert_eq!(rows[2][0].as_deref(), Some("x, y"));
        assert_eq!(rows[2][1].as_deref(), Some("q\""));
        assert!(parse_csv("\"open").is_err());
    }
}
