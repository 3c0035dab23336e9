//! Parquet scans split on row-group boundaries.
//!
//! DataFusion splits a scan's files into byte ranges, one per target
//! partition, and a row group is read by the range holding the first page
//! of its first column. A file of one row group split in two thus gives one
//! partition everything and the other nothing. In one process the empty
//! partition costs nothing; here every partition is a subtask (a thread, a
//! decoded plan, a footer read, broadcast build sides received and hashed),
//! and the tiny statements' time is mostly that fixed cost. So where a
//! scan's byte ranges leave a partition without a row group, its row
//! groups are dealt out again, whole and in file order, over as many
//! partitions as there are row groups (at most as many as before), balanced
//! by compressed bytes; the operators above follow the scan's new partition
//! count.
//!
//! It owns only that rewrite: it reads footers through the session's
//! metadata cache (filled when the tables were registered) and knows
//! nothing of stages or tasks.

use datafusion::common::Result as DfResult;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::datasource::listing::{FileRange, PartitionedFile};
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use datafusion::datasource::physical_plan::{
    FileGroup, FileScanConfig, FileScanConfigBuilder, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::parquet::file::metadata::{PageIndexPolicy, ParquetMetaData};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::sanity_checker::SanityCheckPlan;
use datafusion::physical_plan::ExecutionPlan;
use std::collections::HashMap;
use std::sync::Arc;

/// Where a row group starts, as DataFusion decides which range reads it,
/// and its compressed size.
#[derive(Debug, Clone, Copy, PartialEq)]
struct RowGroupSpan {
    start: i64,
    bytes: i64,
}

/// The file's row groups; `None` if one has no column to place it by or
/// they are not laid out in order (a range ends where the next one starts).
fn spans(metadata: &ParquetMetaData) -> Option<Vec<RowGroupSpan>> {
    let spans: Vec<RowGroupSpan> = metadata
        .row_groups()
        .iter()
        .map(|rg| {
            let col = rg.columns().first()?;
            Some(RowGroupSpan {
                start: col
                    .dictionary_page_offset()
                    .unwrap_or_else(|| col.data_page_offset()),
                bytes: rg.compressed_size().max(1),
            })
        })
        .collect::<Option<_>>()?;
    spans
        .windows(2)
        .all(|w| w[0].start < w[1].start)
        .then_some(spans)
}

/// A file group of a scan, each file with the row groups of the whole file.
type GroupLayout<'a> = Vec<(&'a PartitionedFile, &'a [RowGroupSpan])>;

/// The Parquet scan of a plan node, if it is one this rule may rewrite.
fn parquet_scan(plan: &Arc<dyn ExecutionPlan>) -> Option<&FileScanConfig> {
    let config = plan
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<FileScanConfig>()?;
    // Ordered files keep DataFusion's grouping, which their order relies on.
    (config.file_source.downcast_ref::<ParquetSource>().is_some()
        && config.file_groups.len() > 1
        && config.output_ordering.is_empty())
    .then_some(config)
}

/// Splits the plan's Parquet scans on row-group boundaries where a byte
/// range would hold none; the plan unchanged if none does, or if the
/// rewritten plan would not satisfy its operators' requirements.
pub async fn split_scans_on_row_groups(
    env: &RuntimeEnv,
    options: &ConfigOptions,
    plan: Arc<dyn ExecutionPlan>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    // Each file once, though a file split in ranges is in several groups.
    let mut files = HashMap::new();
    plan.apply(|node| {
        if let Some(config) = parquet_scan(node) {
            for f in config.file_groups.iter().flat_map(|g| g.iter()) {
                files
                    .entry(f.object_meta.location.to_string())
                    .or_insert_with(|| (config.object_store_url.clone(), f.object_meta.clone()));
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if files.is_empty() {
        return Ok(plan);
    }
    let cache = env.cache_manager.get_file_metadata_cache();
    let mut row_groups: HashMap<String, Vec<RowGroupSpan>> = HashMap::new();
    for (key, (url, meta)) in files {
        let store = env.object_store(&url)?;
        let metadata = DFParquetMetadata::new(store.as_ref(), &meta)
            .with_file_metadata_cache(Some(Arc::clone(&cache)))
            .with_page_index_policy(Some(PageIndexPolicy::Skip))
            .fetch_metadata()
            .await;
        // A footer that cannot be read leaves its scans as planned: reading
        // the file reports the error, naming it.
        match metadata.map(|m| spans(&m)) {
            Ok(Some(spans)) => {
                row_groups.insert(key, spans);
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("{key}: footer not read for its row groups: {e}"),
        }
    }
    let rewritten = Arc::clone(&plan)
        .transform_up(|node| {
            let Some(config) = parquet_scan(&node) else {
                return Ok(Transformed::no(node));
            };
            // Every file's row groups known, or the scan stays as planned:
            // a file left out of the new groups would not be read.
            let layout: Option<Vec<GroupLayout>> = config
                .file_groups
                .iter()
                .map(|g| {
                    g.iter()
                        .map(|f| {
                            let spans = row_groups.get(f.object_meta.location.as_ref())?;
                            Some((f, spans.as_slice()))
                        })
                        .collect()
                })
                .collect();
            let Some(groups) = layout.as_deref().and_then(regroup) else {
                return Ok(Transformed::no(node));
            };
            tracing::debug!(
                "scan of {} split on row groups: {} partitions instead of {}",
                config
                    .file_groups
                    .first()
                    .and_then(|g| g.files().first())
                    .map_or_else(String::new, |f| f.object_meta.location.to_string()),
                groups.len(),
                config.file_groups.len()
            );
            let config = FileScanConfigBuilder::from(config.clone())
                .with_file_groups(groups)
                .build();
            Ok(Transformed::yes(
                DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
            ))
        })?
        .data;
    if Arc::ptr_eq(&rewritten, &plan) {
        return Ok(plan);
    }
    // The operators above a scan were rebuilt for its new partition count;
    // any requirement that no longer holds keeps the plan as planned.
    match SanityCheckPlan::new().optimize(Arc::clone(&rewritten), options) {
        Ok(_) => {
            tracing::debug!(
                "Parquet scans split on row groups: {} partitions at the root, {} as planned",
                rewritten
                    .properties()
                    .output_partitioning()
                    .partition_count(),
                plan.properties().output_partitioning().partition_count()
            );
            Ok(rewritten)
        }
        Err(e) => {
            tracing::debug!("scans kept on DataFusion's byte ranges: {e}");
            Ok(plan)
        }
    }
}

/// Whether the range (or the whole file) reads the row group at `start`.
fn reads(file: &PartitionedFile, start: i64) -> bool {
    file.range
        .as_ref()
        .is_none_or(|r| r.start <= start && start < r.end)
}

/// New file groups for a scan laid out as `layout` (per group, its files
/// with the row groups of each whole file), or `None` to keep it: every
/// group already reads a row group, or the files hold none at all.
fn regroup(layout: &[GroupLayout]) -> Option<Vec<FileGroup>> {
    let empty = layout.iter().any(|g| {
        !g.iter()
            .any(|(f, spans)| spans.iter().any(|s| reads(f, s.start)))
    });
    if !empty {
        return None;
    }
    // Every row group once, in file order: a file split in ranges appears
    // in several groups, each reading some of its row groups.
    let mut units: Vec<(&PartitionedFile, usize)> = Vec::new();
    let mut file_spans: HashMap<&str, &[RowGroupSpan]> = HashMap::new();
    for &(f, spans) in layout.iter().flatten() {
        let key = f.object_meta.location.as_ref();
        if !file_spans.contains_key(key) {
            file_spans.insert(key, spans);
            units.extend((0..spans.len()).map(|i| (f, i)));
        }
    }
    if units.is_empty() {
        return None;
    }
    let span = |(f, i): (&PartitionedFile, usize)| file_spans[f.object_meta.location.as_ref()][i];
    let n = layout.len().min(units.len());
    let total: i64 = units.iter().map(|&u| span(u).bytes).sum();
    // Contiguous runs of row groups, each closed once it reaches its share
    // of the bytes, leaving at least one row group for every later group.
    let mut runs: Vec<Vec<(&PartitionedFile, usize)>> = vec![Vec::new(); n];
    let (mut g, mut acc) = (0, 0i64);
    for (k, &u) in units.iter().enumerate() {
        let left = units.len() - k;
        if g + 1 < n
            && !runs[g].is_empty()
            && (left <= n - 1 - g || acc * n as i64 >= total * (g as i64 + 1))
        {
            g += 1;
        }
        runs[g].push(u);
        acc += span(u).bytes;
    }
    let groups = runs
        .into_iter()
        .map(|run| {
            // One ranged file per file in the run: from its first row
            // group's start to the next row group's start (or the end).
            let mut files: Vec<PartitionedFile> = Vec::new();
            let mut i = 0;
            while i < run.len() {
                let (f, first) = run[i];
                let mut last = first;
                while i + 1 < run.len() && std::ptr::eq(run[i + 1].0, f) {
                    i += 1;
                    last = run[i].1;
                }
                let spans = file_spans[f.object_meta.location.as_ref()];
                let end = spans
                    .get(last + 1)
                    .map_or(f.object_meta.size as i64, |s| s.start);
                let mut file = f.clone();
                file.range = Some(FileRange {
                    start: spans[first].start,
                    end,
                });
                files.push(file);
                i += 1;
            }
            FileGroup::new(files)
        })
        .collect();
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{physical_plan, register_parquet};
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::object_store::ObjectMeta;
    use datafusion::object_store::path::Path;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use datafusion::physical_plan::{collect, common};
    use datafusion::prelude::{SessionConfig, SessionContext};

    fn file(name: &str, size: u64, range: Option<(i64, i64)>) -> PartitionedFile {
        let mut f = PartitionedFile::from(ObjectMeta {
            location: Path::from(name),
            last_modified: Default::default(),
            size,
            e_tag: None,
            version: None,
        });
        f.range = range.map(|(start, end)| FileRange { start, end });
        f
    }

    /// The layout `regroup` reads, over files and row groups owned here.
    fn borrowed(layout: &[Vec<(PartitionedFile, Vec<RowGroupSpan>)>]) -> Vec<GroupLayout<'_>> {
        layout
            .iter()
            .map(|g| g.iter().map(|(f, s)| (f, s.as_slice())).collect())
            .collect()
    }

    fn rg(start: i64, bytes: i64) -> RowGroupSpan {
        RowGroupSpan { start, bytes }
    }

    /// (file, range) of every file of every group.
    fn shape(groups: &[FileGroup]) -> Vec<Vec<(String, i64, i64)>> {
        groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|f| {
                        let r = f.range.as_ref().map_or((0, -1), |r| (r.start, r.end));
                        (f.object_meta.location.to_string(), r.0, r.1)
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_file_of_one_row_group_split_in_two_becomes_one_partition() {
        let spans = vec![rg(4, 1000)];
        let layout = vec![
            vec![(file("a", 1100, Some((0, 550))), spans.clone())],
            vec![(file("a", 1100, Some((550, 1100))), spans)],
        ];
        let groups = regroup(&borrowed(&layout)).expect("one range reads nothing");
        assert_eq!(shape(&groups), vec![vec![("a".to_string(), 4, 1100)]]);
    }

    #[test]
    fn ranges_that_each_read_a_row_group_are_kept() {
        let spans = vec![rg(4, 600), rg(604, 496)];
        let layout = vec![
            vec![(file("a", 1100, Some((0, 550))), spans.clone())],
            vec![(file("a", 1100, Some((550, 1100))), spans)],
        ];
        assert!(regroup(&borrowed(&layout)).is_none());
    }

    #[test]
    fn row_groups_are_dealt_whole_and_in_order_by_bytes() {
        // Three row groups of a, the second large, read by ranges that leave
        // the second partition empty; then a file b of one row group.
        let a = vec![rg(4, 100), rg(104, 800), rg(904, 100)];
        let b = vec![rg(4, 200)];
        let layout = vec![
            vec![(file("a", 1010, None), a.clone())],
            vec![(file("b", 210, Some((100, 210))), b.clone())],
            vec![(file("b", 210, Some((0, 100))), b)],
        ];
        let groups = regroup(&borrowed(&layout)).expect("the second group reads nothing");
        // 1200 bytes over 3 groups: a's first two row groups pass the first
        // share, its third and b make up the rest.
        assert_eq!(
            shape(&groups),
            vec![
                vec![("a".to_string(), 4, 904)],
                vec![("a".to_string(), 904, 1010)],
                vec![("b".to_string(), 4, 210)],
            ]
        );
        // Every row group is read by exactly one new range.
        for (name, spans) in [("a", vec![4, 104, 904]), ("b", vec![4])] {
            for s in spans {
                let readers = groups
                    .iter()
                    .flat_map(|g| g.iter())
                    .filter(|f| f.object_meta.location.as_ref() == name && reads(f, s))
                    .count();
                assert_eq!(readers, 1, "row group of {name} at {s}");
            }
        }
    }

    /// A table `t` of one Parquet file with row groups of these sizes
    /// (rows of one Int64 column), planned by DataFusion at `partitions`
    /// with every file split in byte ranges.
    async fn scan_plan(
        dir: &std::path::Path,
        row_groups: &[usize],
        partitions: usize,
    ) -> (SessionContext, Arc<dyn ExecutionPlan>) {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let file = std::fs::File::create(dir.join("t.parquet")).unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(row_groups.iter().copied().max().unwrap_or(1)))
            .build();
        let mut w = ArrowWriter::try_new(file, Arc::clone(&schema), Some(props)).unwrap();
        let mut next = 0i64;
        for &n in row_groups {
            let values: Vec<i64> = (next..next + n as i64).collect();
            next += n as i64;
            let batch = RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(Int64Array::from(values))],
            )
            .unwrap();
            w.write(&batch).unwrap();
            w.flush().unwrap();
        }
        w.close().unwrap();
        // DataFusion splits files only for inputs of more than one batch.
        let mut config = SessionConfig::new()
            .with_target_partitions(partitions)
            .with_batch_size(1024);
        config.options_mut().optimizer.repartition_file_min_size = 0;
        // As in a job: each partition reads its own file group.
        config
            .options_mut()
            .set(
                "datafusion.execution.enable_file_stream_work_stealing",
                "false",
            )
            .unwrap();
        let ctx = SessionContext::new_with_config(config);
        register_parquet(&ctx, "t", dir).await;
        // An aggregate above the scan: DataFusion splits files only where
        // the operators above gain from more partitions.
        let plan = physical_plan(&ctx, "SELECT count(*), sum(v) FROM t").await;
        (ctx, plan)
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// Rows each partition of the plan's scan reads.
    async fn rows_per_partition(ctx: &SessionContext, plan: &Arc<dyn ExecutionPlan>) -> Vec<usize> {
        let mut scan = None;
        plan.apply(|node| {
            if node.downcast_ref::<DataSourceExec>().is_some() {
                scan = Some(Arc::clone(node));
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        let scan = scan.expect("a scan");
        let mut rows = Vec::new();
        for p in 0..scan.properties().output_partitioning().partition_count() {
            let batches = common::collect(scan.execute(p, ctx.task_ctx()).unwrap())
                .await
                .unwrap();
            rows.push(batches.iter().map(|b| b.num_rows()).sum());
        }
        rows
    }

    /// The plan's one row: count(*) and sum(v).
    async fn count_and_sum(ctx: &SessionContext, plan: Arc<dyn ExecutionPlan>) -> (i64, i64) {
        let batches = collect(plan, ctx.task_ctx()).await.unwrap();
        let value = |c: usize| {
            batches[0]
                .column(c)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0)
        };
        (value(0), value(1))
    }

    /// The plan with its scans split, with the session's runtime and options.
    async fn split(ctx: &SessionContext, plan: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        let state = ctx.state();
        split_scans_on_row_groups(state.runtime_env(), state.config_options(), plan)
            .await
            .unwrap()
    }

    #[test]
    fn a_file_of_one_row_group_is_read_by_one_partition_instead_of_an_empty_one_beside_it() {
        block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let (ctx, plan) = scan_plan(dir.path(), &[5000], 2).await;
            assert_eq!(rows_per_partition(&ctx, &plan).await, vec![5000, 0]);
            let split = split(&ctx, plan).await;
            assert_eq!(rows_per_partition(&ctx, &split).await, vec![5000]);
            assert_eq!(count_and_sum(&ctx, split).await, (5000, (0..5000).sum()));
        });
    }

    #[test]
    fn row_groups_are_dealt_out_whole_where_byte_ranges_leave_a_partition_empty() {
        block_on(async {
            let dir = tempfile::tempdir().unwrap();
            // Four byte ranges over three row groups: one range reads none.
            let (ctx, plan) = scan_plan(dir.path(), &[3000, 1000, 1000], 4).await;
            let before = rows_per_partition(&ctx, &plan).await;
            assert_eq!(before.len(), 4);
            assert!(before.contains(&0), "{before:?}");
            let split = split(&ctx, plan).await;
            // Whole row groups, in file order, every row once.
            assert_eq!(
                rows_per_partition(&ctx, &split).await,
                vec![3000, 1000, 1000]
            );
            assert_eq!(count_and_sum(&ctx, split).await, (5000, (0..5000).sum()));
        });
    }

    #[test]
    fn ranges_that_all_read_row_groups_keep_datafusions_plan() {
        block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let (ctx, plan) = scan_plan(dir.path(), &[2000; 4], 2).await;
            let before = rows_per_partition(&ctx, &plan).await;
            assert!(before.len() == 2 && !before.contains(&0), "{before:?}");
            let split = split(&ctx, Arc::clone(&plan)).await;
            assert!(Arc::ptr_eq(&split, &plan));
        });
    }

    #[test]
    fn two_row_groups_that_start_in_the_first_range_go_one_to_each_partition() {
        block_on(async {
            let dir = tempfile::tempdir().unwrap();
            // The footer makes the file's second half start after the
            // second row group does.
            let (ctx, plan) = scan_plan(dir.path(), &[2000, 2000], 2).await;
            assert_eq!(rows_per_partition(&ctx, &plan).await, vec![4000, 0]);
            let split = split(&ctx, plan).await;
            assert_eq!(rows_per_partition(&ctx, &split).await, vec![2000, 2000]);
            assert_eq!(count_and_sum(&ctx, split).await, (4000, (0..4000).sum()));
        });
    }

    #[test]
    fn files_without_row_groups_are_left_to_datafusion() {
        let layout = vec![
            vec![(file("a", 10, None), vec![])],
            vec![(file("b", 10, None), vec![])],
        ];
        assert!(regroup(&borrowed(&layout)).is_none());
    }
}
