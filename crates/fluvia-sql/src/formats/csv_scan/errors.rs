//! Naming the row of a CSV file that does not fit its declared schema.
//!
//! A scan that fails to parse a value reports the column by position and
//! the line relative to the byte range it read, without the file. On that
//! error path only, the task reads the CSV files of its scans again, from
//! their start and with the same options, to name the file, the line (1 is
//! the first line of the file, the header included) and the column.

use datafusion::arrow::csv::ReaderBuilder;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::datasource::physical_plan::{CsvSource, FileScanConfig};
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::ExecutionPlan;
use std::sync::Arc;

/// For a CSV parse error raised while running `plan`, where it is:
/// `file: line L, column 'c' (type): message`; `None` if no file of the
/// plan's CSV scans fails to parse.
pub fn locate(plan: &Arc<dyn ExecutionPlan>, error: &str) -> Option<String> {
    if !error.contains("Error while parsing value")
        && !error.contains("Csv error")
        && !error.contains("Parser error")
    {
        return None;
    }
    let mut scans = Vec::new();
    csv_scans(plan, &mut scans);
    for (config, csv) in scans {
        let schema = Arc::clone(config.file_schema());
        for file in config.file_groups.iter().flat_map(|g| g.iter()) {
            let path = format!("/{}", file.object_meta.location);
            let Some(reader) = open(&path, &schema, csv) else {
                continue;
            };
            for batch in reader {
                if let Err(e) = batch {
                    let message = e.to_string();
                    // Some parsers (decimals) say neither line nor column:
                    // find both by casting the row's text.
                    if !message.contains(" line ")
                        && let Some(found) = find_by_cast(&path, &schema, csv, &message)
                    {
                        return Some(found);
                    }
                    return Some(describe(&path, &schema, &message));
                }
            }
        }
    }
    None
}

fn open(
    path: &str,
    schema: &SchemaRef,
    csv: &CsvSource,
) -> Option<datafusion::arrow::csv::Reader<std::fs::File>> {
    let f = std::fs::File::open(path).ok()?;
    let mut builder = ReaderBuilder::new(Arc::clone(schema))
        .with_header(csv.has_header())
        .with_delimiter(csv.delimiter())
        .with_quote(csv.quote());
    if let Some(e) = csv.escape() {
        builder = builder.with_escape(e);
    }
    if let Some(t) = csv.terminator() {
        builder = builder.with_terminator(t);
    }
    if let Some(c) = csv.comment() {
        builder = builder.with_comment(c);
    }
    builder.build(f).ok()
}

/// Reads `path` as text and casts each column to its type: the first value
/// that does not cast names the line and column.
fn find_by_cast(path: &str, schema: &SchemaRef, csv: &CsvSource, message: &str) -> Option<String> {
    use datafusion::arrow::compute::{CastOptions, cast_with_options};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let text = Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let strict = CastOptions {
        safe: false,
        ..CastOptions::default()
    };
    let mut row = 0usize;
    for batch in open(path, &text, csv)? {
        let batch = batch.ok()?;
        for (i, field) in schema.fields().iter().enumerate() {
            let column = batch.column(i);
            if cast_with_options(column, field.data_type(), &strict).is_ok() {
                continue;
            }
            for r in 0..batch.num_rows() {
                if cast_with_options(&column.slice(r, 1), field.data_type(), &strict).is_err() {
                    let line = row + r + 1 + usize::from(csv.has_header());
                    return Some(format!(
                        "{path}: line {line}, column '{}' ({}): {message}",
                        field.name(),
                        field.data_type()
                    ));
                }
            }
        }
        row += batch.num_rows();
    }
    None
}

fn csv_scans<'a>(
    plan: &'a Arc<dyn ExecutionPlan>,
    out: &mut Vec<(&'a FileScanConfig, &'a CsvSource)>,
) {
    if let Some(ds) = plan.downcast_ref::<DataSourceExec>()
        && let Some(config) = ds.data_source().downcast_ref::<FileScanConfig>()
        && let Some(csv) = config.file_source.downcast_ref::<CsvSource>().or_else(|| {
            config
                .file_source
                .downcast_ref::<super::FluviaCsvSource>()
                .map(|f| f.inner())
        })
    {
        out.push((config, csv));
    }
    for child in plan.children() {
        csv_scans(child, out);
    }
}

/// `path: line L, column 'name' (type): message` from arrow's "... for
/// column N at line L ..." (its lines count from 0, the header included).
fn describe(path: &str, schema: &datafusion::arrow::datatypes::Schema, message: &str) -> String {
    let number_after = |key: &str| -> Option<usize> {
        let rest = &message[message.find(key)? + key.len()..];
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        digits.parse().ok()
    };
    // "at line L" counts from 0; "for line L" (a wrong number of fields)
    // from 1, both with the header.
    let line = number_after("at line ")
        .map(|l| l + 1)
        .or_else(|| number_after("for line "));
    let column = number_after("for column ").and_then(|i| schema.fields().get(i));
    let mut s = path.to_string();
    if let Some(l) = line {
        s.push_str(&format!(": line {l}"));
    }
    if let Some(c) = column {
        s.push_str(&format!(", column '{}' ({})", c.name(), c.data_type()));
    }
    format!("{s}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    #[test]
    fn names_line_and_column() {
        let schema = Schema::new(vec![
            Field::new("zip", DataType::Utf8, true),
            Field::new("n", DataType::Int64, true),
        ]);
        let s = describe(
            "/d/t/b.csv",
            &schema,
            "Parser error: Error while parsing value 'x' as type 'Int64' for column 1 at line 2.",
        );
        assert!(
            s.starts_with("/d/t/b.csv: line 3, column 'n' (Int64): Parser error"),
            "{s}"
        );
        let s = describe(
            "/d/t/b.csv",
            &schema,
            "Csv error: incorrect number of fields for line 3, expected 2 got 3",
        );
        assert!(s.starts_with("/d/t/b.csv: line 3: Csv error"), "{s}");
    }
}
