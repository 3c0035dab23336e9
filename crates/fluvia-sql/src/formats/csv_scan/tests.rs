//! The reader against DataFusion's, and its parts against references.

use super::fields::{classify, classify_scalar, unquote};
use super::values::{parse_date, parse_decimal, parse_int};
use super::*;
use datafusion::arrow::datatypes::{Date32Type, Decimal128Type, Int64Type};

#[test]
fn classify_matches_the_scalar_reference() {
    let text: Vec<u8> = (0..64u32)
        .map(|i| match i % 7 {
            0 => b',',
            3 => b'\n',
            5 => b'|',
            _ => b'a' + (i % 26) as u8,
        })
        .collect();
    let block: &[u8; 64] = text.as_slice().try_into().unwrap();
    for (d, q) in [(b',', b'"'), (b'|', b'a'), (b',', 0)] {
        assert_eq!(classify(block, d, q), classify_scalar(block, d, q));
    }
    let (any, lines, special) = classify_scalar(block, b',', b'b');
    assert_eq!(any.count_ones(), 19);
    assert_eq!(lines.count_ones(), 9);
    assert_eq!(special.count_ones(), 3);
}

#[test]
fn fast_parsers_agree_with_arrow() {
    use datafusion::arrow::compute::kernels::cast_utils::{Parser, parse_decimal as arrow};
    for s in ["0", "-1", "123456789012345678", "2147483647", "-2147483648"] {
        assert_eq!(parse_int(s.as_bytes()), Int64Type::parse(s), "{s}");
    }
    assert_eq!(
        parse_int(b"1234567890123456789"),
        None,
        "19 digits go to arrow"
    );
    assert_eq!(parse_int(b"+1"), None);
    assert_eq!(parse_int(b"1a"), None);
    for s in ["0.00", "-12.5", "99999.99", "7", "-0.01", "00012.30"] {
        assert_eq!(
            parse_decimal(s.as_bytes(), 7, 2),
            arrow::<Decimal128Type>(s, 7, 2).ok(),
            "{s}"
        );
    }
    assert_eq!(
        parse_decimal(b"1.234", 7, 2),
        None,
        "more decimals than the scale"
    );
    assert_eq!(
        parse_decimal(b"123456.1", 7, 2),
        None,
        "too many integer digits"
    );
    assert_eq!(parse_decimal(b"1.", 7, 2), None);
    assert_eq!(
        parse_decimal(b"9999999999999999999", 38, 0),
        None,
        "19 digits go to arrow"
    );
    assert_eq!(parse_decimal(b"1.2.3", 7, 2), None);
    for s in [
        "1970-01-01",
        "2000-02-29",
        "1998-01-02",
        "2003-12-31",
        "1900-03-01",
        "0001-01-01",
    ] {
        assert_eq!(parse_date(s.as_bytes()), Date32Type::parse(s), "{s}");
    }
    assert_eq!(parse_date(b"2001-02-29"), None);
    assert_eq!(parse_date(b"2001-13-01"), None);
    assert_eq!(parse_date(b"2001-1-01x"), None);
}

use datafusion::arrow::compute::concat_batches;
use datafusion::config::CsvOptions;
use datafusion::datasource::physical_plan::FileGroup;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::physical_plan::collect_partitioned;
use datafusion::prelude::SessionContext;

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        datafusion::arrow::datatypes::Field::new("id", DataType::Int32, false),
        datafusion::arrow::datatypes::Field::new("name", DataType::Utf8View, true),
        datafusion::arrow::datatypes::Field::new("price", DataType::Decimal128(7, 2), true),
        datafusion::arrow::datatypes::Field::new("day", DataType::Date32, true),
        datafusion::arrow::datatypes::Field::new("big", DataType::Int64, true),
        datafusion::arrow::datatypes::Field::new("note", DataType::Utf8, true),
        datafusion::arrow::datatypes::Field::new("ratio", DataType::Float64, true),
    ]))
}

/// Rows with what CSV files hold: empty fields, quoted delimiters,
/// doubled quotes, text after a closing quote, `\r\n` and empty lines,
/// values only arrow's parsers read (`+7`, `1e3`, 19 digits).
fn text(rows: usize, quotes: bool) -> String {
    let mut s = String::from("id,name,price,day,big,note,ratio\n");
    for i in 0..rows {
        let name = match (i % 9, quotes) {
            (0, _) => String::new(),
            (1, true) => "\"a, b\"".to_string(),
            (2, true) => "\"say \"\"hi\"\"\"".to_string(),
            (3, true) => "\"ab\"cd".to_string(),
            (4, true) => "x\"y".to_string(),
            _ => format!("name{i}"),
        };
        let price = match i % 5 {
            0 => String::new(),
            1 => format!("-{}.5", i % 1000),
            2 => "+7".to_string(),
            _ => format!("{}.{:02}", i % 99_999, i % 100),
        };
        let day = match i % 6 {
            0 => String::new(),
            1 => "2000-02-29".to_string(),
            _ => format!("19{:02}-{:02}-{:02}", i % 100, i % 12 + 1, i % 28 + 1),
        };
        let big = match i % 4 {
            0 => "-1234567890123456789".to_string(),
            1 => String::new(),
            _ => format!("{}", i as i64 * 1_000_003),
        };
        let end = if quotes && i % 11 == 0 { "\r\n" } else { "\n" };
        s.push_str(&format!(
            "{i},{name},{price},{day},{big},n{},{}{end}",
            i % 13,
            if i % 3 == 0 {
                "1e3".into()
            } else {
                format!("{i}.25")
            }
        ));
        if quotes && i % 50 == 7 {
            s.push('\n');
        }
    }
    s
}

/// `text` as file `name` in a directory of its own (removed when the
/// returned guard drops); its path and size.
fn write(name: &str, text: &str) -> (tempfile::TempDir, String, u64) {
    let dir = tempfile::Builder::new()
        .prefix("fluvia-csv-scan-")
        .tempdir()
        .unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    let path = path.to_string_lossy().into_owned();
    (dir, path, text.len() as u64)
}

/// The file read in `ranges` byte ranges, once by DataFusion's scan and
/// once by Fluvia's, with `projection`.
fn scans(
    path: &str,
    size: u64,
    ranges: u64,
    projection: Option<Vec<usize>>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
) -> (Arc<dyn ExecutionPlan>, Arc<dyn ExecutionPlan>) {
    let options = CsvOptions {
        has_header: Some(true),
        ..Default::default()
    };
    let csv = CsvSource::new(schema()).with_csv_options(options);
    let step = size.div_ceil(ranges);
    let groups = (0..ranges)
        .map(|k| {
            let (a, b) = (k * step, ((k + 1) * step).min(size));
            let file = if ranges == 1 {
                PartitionedFile::new(path.to_string(), size)
            } else {
                PartitionedFile::new_with_range(path.to_string(), size, a as i64, b as i64)
            };
            FileGroup::new(vec![file])
        })
        .collect();
    let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(csv))
        .with_file_groups(groups)
        .with_projection_indices(projection)
        .unwrap()
        .build();
    let theirs: Arc<dyn ExecutionPlan> = DataSourceExec::from_data_source(config);
    let ours = FluviaCsvSource::wrap(Arc::clone(&theirs));
    let ours = match predicate {
        None => ours,
        Some(p) => {
            let ds = ours.downcast_ref::<DataSourceExec>().unwrap();
            let config = ds.data_source().downcast_ref::<FileScanConfig>().unwrap();
            let source = config
                .file_source
                .downcast_ref::<FluviaCsvSource>()
                .unwrap();
            let source: Arc<dyn FileSource> = Arc::new(source.clone().with_predicate(Some(p)));
            DataSourceExec::from_data_source(
                FileScanConfigBuilder::from(config.clone())
                    .with_source(source)
                    .build(),
            )
        }
    };
    (theirs, ours)
}

/// All rows the plan reads, sorted: DataFusion lets a partition that
/// is done take files (ranges) queued for another.
fn read(plan: Arc<dyn ExecutionPlan>) -> Result<RecordBatch> {
    use datafusion::arrow::compute::{SortColumn, lexsort_to_indices, take_record_batch};
    let ctx = SessionContext::new();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let schema = plan.schema();
    let parts = rt.block_on(collect_partitioned(plan, ctx.task_ctx()))?;
    let all = concat_batches(&schema, parts.iter().flatten())?;
    if all.num_columns() == 0 {
        return Ok(all);
    }
    let keys: Vec<SortColumn> = all
        .columns()
        .iter()
        .map(|c| SortColumn {
            values: Arc::clone(c),
            options: None,
        })
        .collect();
    Ok(take_record_batch(&all, &lexsort_to_indices(&keys, None)?)?)
}

#[test]
fn reads_what_datafusion_reads_in_any_ranges_and_projection() {
    for quotes in [false, true] {
        let (_dir, path, size) = write("t.csv", &text(3000, quotes));
        // A batch size that does not divide the rows.
        for ranges in [1, 2, 7] {
            for projection in [None, Some(vec![6, 0, 2]), Some(vec![1, 3]), Some(vec![])] {
                let (theirs, ours) = scans(&path, size, ranges, projection.clone(), None);
                assert!(ours.downcast_ref::<DataSourceExec>().is_some());
                let (a, b) = (read(theirs).unwrap(), read(ours).unwrap());
                assert_eq!(a, b, "quotes {quotes}, {ranges} ranges, {projection:?}");
                assert_eq!(b.num_rows(), 3000);
            }
        }
    }
}

#[test]
fn quoted_line_ends_stay_in_their_field_when_the_file_is_read_whole() {
    let text = "id,name,price,day,big,note,ratio\n1,\"two\nlines\",1.00,,,\"x\r\ny\",1\n2,b,,,,,\n";
    let (_dir, path, size) = write("q.csv", text);
    let (theirs, ours) = scans(&path, size, 1, None, None);
    let (a, b) = (read(theirs).unwrap(), read(ours).unwrap());
    assert_eq!(a, b);
    assert_eq!(b.num_rows(), 2);
}

#[test]
fn bad_rows_fail_with_arrow_csv_wording() {
    let (_dir, path, size) = write(
        "bad.csv",
        "id,name,price,day,big,note,ratio\n1,a,1.00,,,,\n2,b\n",
    );
    let (_, ours) = scans(&path, size, 1, None, None);
    let e = read(ours).unwrap_err().to_string();
    assert!(
        e.contains("incorrect number of fields for line 2, expected 7 got 2"),
        "{e}"
    );
    let (_dir, path, size) = write(
        "bad.csv",
        "id,name,price,day,big,note,ratio\n1,a,1.0x,,,,\n",
    );
    let (_, ours) = scans(&path, size, 1, Some(vec![2]), None);
    let e = read(ours).unwrap_err().to_string();
    assert!(e.contains("Error while parsing value '1.0x'"), "{e}");
    assert!(e.contains("Decimal128(7, 2)"), "{e}");
    let (_dir, path, size) = write("bad.csv", "id,name,price,day,big,note,ratio\n1,\"a,,,,,,\n");
    let (_, ours) = scans(&path, size, 1, None, None);
    let e = read(ours).unwrap_err().to_string();
    assert!(e.contains("unterminated quoted field"), "{e}");
}

#[test]
fn a_runtime_filter_drops_rows_before_the_other_columns_are_parsed() {
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column as Col, lit};
    // A value that does not parse sits only in rows the filter drops.
    let mut text = String::from("id,name,price,day,big,note,ratio\n");
    for i in 0..20_000 {
        let price = if i % 10 == 0 { "1.00" } else { "oops" };
        text.push_str(&format!("{i},n{i},{price},,,,\n"));
    }
    let (_dir, path, size) = write("f.csv", &text);
    let keep: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(
        Arc::new(BinaryExpr::new(
            Arc::new(Col::new("id", 0)),
            Operator::Modulo,
            lit(10),
        )),
        Operator::Eq,
        lit(0),
    ));
    let (_, ours) = scans(&path, size, 3, Some(vec![2, 1]), Some(keep));
    let batch = read(ours).unwrap();
    assert_eq!(batch.num_rows(), 2000);
    assert_eq!(batch.schema().field(0).name(), "price");
}

#[test]
fn unquote_follows_csv_core() {
    let mut out = Vec::new();
    unquote(br#""a""b""#, b'"', &mut out);
    assert_eq!(out, br#"a"b"#);
    unquote(br#""ab"cd"#, b'"', &mut out);
    assert_eq!(out, b"abcd");
    unquote(br#""a"b"c"#, b'"', &mut out);
    assert_eq!(out, br#"ab"c"#);
}
