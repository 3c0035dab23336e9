//! `_schema.json`: the schema of a folder of files that carry none (CSV),
//! and the column statistics a table declares for the planner.

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use fluvia_core::{FluviaError, Result};
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

/// The file beside a table's data that declares its columns:
/// `{"fields": [{"name": "c", "type": "Int32", "nullable": true}, ...]}`,
/// types as Arrow writes them (`Utf8`, `Date32`, `Decimal128(7, 2)`).
pub const SCHEMA_FILE: &str = "_schema.json";

#[derive(serde::Serialize, serde::Deserialize)]
struct SchemaFile {
    fields: Vec<SchemaField>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct SchemaField {
    name: String,
    #[serde(rename = "type")]
    data_type: String,
    #[serde(default = "yes")]
    nullable: bool,
    /// Column statistics, optional (Flink's catalog column statistics):
    /// smallest and largest value as text, and nulls over the table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nulls: Option<u64>,
}

/// Declared statistics of one column, as text (see [`SCHEMA_FILE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeclaredColumnStats {
    pub min: Option<String>,
    pub max: Option<String>,
    pub nulls: Option<u64>,
}

fn yes() -> bool {
    true
}

/// `schema` as a [`SCHEMA_FILE`], with the column statistics given (one
/// per field, or none).
pub fn schema_file_json(schema: &Schema, stats: &[DeclaredColumnStats]) -> String {
    let file = SchemaFile {
        fields: schema
            .fields()
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let st = stats.get(i).cloned().unwrap_or_default();
                SchemaField {
                    name: f.name().clone(),
                    data_type: f.data_type().to_string(),
                    nullable: f.is_nullable(),
                    min: st.min,
                    max: st.max,
                    nulls: st.nulls,
                }
            })
            .collect(),
    };
    serde_json::to_string_pretty(&file).unwrap_or_default()
}

/// Reads a [`SCHEMA_FILE`]: the schema and the column statistics it
/// declares (one per field); errors name the file and the field.
pub fn read_schema_file(path: &Path) -> Result<(SchemaRef, Vec<DeclaredColumnStats>)> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| FluviaError::io(format!("reading {}", path.display()), e))?;
    let file: SchemaFile = serde_json::from_str(&text)
        .map_err(|e| FluviaError::Config(format!("{}: {e}", path.display())))?;
    let mut fields = Vec::with_capacity(file.fields.len());
    let mut stats = Vec::with_capacity(file.fields.len());
    for f in file.fields {
        let t = DataType::from_str(&f.data_type).map_err(|e| {
            FluviaError::Config(format!(
                "{}: column '{}' has type '{}', which is not an Arrow type: {e}",
                path.display(),
                f.name,
                f.data_type
            ))
        })?;
        fields.push(Field::new(&f.name, t, f.nullable));
        stats.push(DeclaredColumnStats {
            min: f.min,
            max: f.max,
            nulls: f.nulls,
        });
    }
    Ok((Arc::new(Schema::new(fields)), stats))
}
