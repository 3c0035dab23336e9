//! The shared scan of a task that runs several fragments of a reuse group
//! (see `planning::source_reuse`): [`share_scans`] turns the scans
//! that are the same for this subtask into one read, with the union of
//! their columns and the disjunction of their filters, whose batches
//! [`SharedScanExec`] leaves hand to every consumer; each consumer keeps
//! its own columns and applies its own filters on top. Also which scans are
//! the same (`scan_key`).

use crate::exec::pass_through::plan_basics;
use crate::formats::codec::FluviaCodec;
use crate::formats::csv_scan::{FluviaCsvSource, csv_with_columns};
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DataFusionError, Result as DfResult};
use datafusion::datasource::physical_plan::{
    CsvSource, FileScanConfig, FileScanConfigBuilder, FileSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::BinaryExpr;
use datafusion::physical_expr::projection::ProjectionExpr;
use datafusion::physical_expr::utils::{collect_columns, reassign_expr_columns};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, PlanProperties,
};
use datafusion_proto::bytes::physical_plan_to_bytes_with_extension_codec;
use futures::{Stream, StreamExt};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

/// The file scan config of `plan` if it is a scan this module can share:
/// CSV, with either reader. Not Parquet: its scans cost less than the
/// blocking partitions a shared task writes (the TPC-DS suite at SF 1 took
/// 24.8 s with Parquet scans shared, 22.4 s without).
pub(crate) fn shareable(plan: &Arc<dyn ExecutionPlan>) -> Option<&FileScanConfig> {
    let config = plan
        .downcast_ref::<DataSourceExec>()?
        .data_source()
        .downcast_ref::<FileScanConfig>()?;
    let source = &config.file_source;
    let known = source.downcast_ref::<FluviaCsvSource>().is_some()
        || source.downcast_ref::<CsvSource>().is_some();
    known.then_some(config)
}

/// The scan of `config` reading table columns `columns`, with `predicate`
/// as its runtime filter instead of its own (Fluvia's reader; DataFusion's
/// takes none); `None` for a source this module does not share.
fn scan_with_columns(
    config: &FileScanConfig,
    columns: &[usize],
    predicate: Option<Arc<dyn PhysicalExpr>>,
) -> Option<Arc<dyn ExecutionPlan>> {
    let source = &config.file_source;
    let source: Arc<dyn FileSource> = if let Some(f) = source.downcast_ref::<FluviaCsvSource>() {
        Arc::new(f.with_columns(columns).ok()?.with_predicate(predicate))
    } else if let Some(c) = source.downcast_ref::<CsvSource>() {
        Arc::new(csv_with_columns(c, columns).ok()?)
    } else {
        return None;
    };
    let config = FileScanConfigBuilder::from(config.clone())
        .with_source(source)
        .build();
    Some(DataSourceExec::from_data_source(config))
}

/// What makes two scans the same read: the scan with every column and no
/// filter, encoded (files, byte ranges, options, limit).
pub(crate) fn scan_key(config: &FileScanConfig) -> Option<Vec<u8>> {
    let all: Vec<usize> = (0..table_width(config)).collect();
    let wide = scan_with_columns(config, &all, None)?;
    physical_plan_to_bytes_with_extension_codec(wide, &FluviaCodec)
        .ok()
        .map(|b| b.to_vec())
}

fn table_width(config: &FileScanConfig) -> usize {
    config
        .file_source
        .table_schema()
        .table_schema()
        .fields()
        .len()
}

/// The table columns a scan reads: those of its projection and of its
/// runtime filters.
fn columns_read(config: &FileScanConfig) -> Option<BTreeSet<usize>> {
    let table = config.file_source.table_schema().table_schema();
    let mut out = BTreeSet::new();
    match config.file_source.projection() {
        Some(p) => {
            for e in p.iter() {
                out.extend(collect_columns(&e.expr).iter().map(|c| c.index()));
            }
        }
        None => out.extend(0..table.fields().len()),
    }
    if let Some(f) = config.file_source.filter() {
        for c in collect_columns(&f) {
            out.insert(table.index_of(c.name()).ok()?);
        }
    }
    Some(out)
}

/// The plans of one task's fragments (each viewed for the subtask) with
/// every scan that appears more than once read once: the occurrences
/// become leaves of one [`SharedScan`] reading the union of their columns,
/// each under its own runtime filters and projection.
pub fn share_scans(plans: Vec<Arc<dyn ExecutionPlan>>) -> DfResult<Vec<Arc<dyn ExecutionPlan>>> {
    // Single-partition scans by key, with their place: (plan, how many
    // scans come before it). Scans are leaves, met left to right by this
    // walk and by the rewrite's alike.
    type Places = Vec<((usize, usize), FileScanConfig)>;
    let mut occurrences: BTreeMap<Vec<u8>, Places> = BTreeMap::new();
    for (i, plan) in plans.iter().enumerate() {
        let mut k = 0;
        plan.apply(|n| {
            if let Some(config) = shareable(n) {
                if n.output_partitioning().partition_count() == 1
                    && let Some(key) = scan_key(config)
                {
                    occurrences
                        .entry(key)
                        .or_default()
                        .push(((i, k), config.clone()));
                }
                k += 1;
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
    }
    // (plan, scan index) -> (shared scan, consumer index)
    let mut slots: BTreeMap<(usize, usize), (Arc<SharedScan>, usize)> = BTreeMap::new();
    for found in occurrences.into_values().filter(|p| p.len() >= 2) {
        let (places, configs): (Vec<(usize, usize)>, Vec<FileScanConfig>) =
            found.into_iter().unzip();
        let mut columns = BTreeSet::new();
        for c in &configs {
            match columns_read(c) {
                Some(cols) => columns.extend(cols),
                None => columns.extend(0..table_width(c)),
            }
        }
        let columns: Vec<usize> = columns.into_iter().collect();
        // The shared scan may drop what every consumer drops: the
        // disjunction of their filters, when each has one (each consumer
        // still applies its own above it).
        let filters: Option<Vec<Arc<dyn PhysicalExpr>>> =
            configs.iter().map(|c| c.file_source.filter()).collect();
        let predicate = filters.and_then(|f| {
            f.into_iter().reduce(|a, b| {
                Arc::new(BinaryExpr::new(a, Operator::Or, b)) as Arc<dyn PhysicalExpr>
            })
        });
        let Some(scan) = scan_with_columns(&configs[0], &columns, predicate) else {
            continue;
        };
        let shared = Arc::new(SharedScan::new(scan, places.len()));
        for (consumer, place) in places.into_iter().enumerate() {
            slots.insert(place, (Arc::clone(&shared), consumer));
        }
    }
    if slots.is_empty() {
        return Ok(plans);
    }
    plans
        .into_iter()
        .enumerate()
        .map(|(i, plan)| {
            let mut k = 0;
            plan.transform_up(|n| {
                let Some(config) = shareable(&n) else {
                    return Ok(Transformed::no(n));
                };
                let here = k;
                k += 1;
                let Some((shared, consumer)) = slots.get(&(i, here)) else {
                    return Ok(Transformed::no(n));
                };
                let leaf = consumer_of(config, shared, *consumer)?;
                // Anything but the exact schema would change the operators
                // above: then this occurrence reads on its own.
                if leaf.schema() != n.schema() {
                    shared.close(*consumer);
                    return Ok(Transformed::no(n));
                }
                Ok(Transformed::yes(leaf))
            })
            .map(|t| t.data)
        })
        .collect()
}

/// One occurrence of a shared scan: the shared leaf, the occurrence's
/// runtime filters, its own columns.
fn consumer_of(
    config: &FileScanConfig,
    shared: &Arc<SharedScan>,
    consumer: usize,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    let leaf: Arc<dyn ExecutionPlan> = Arc::new(SharedScanExec::new(Arc::clone(shared), consumer));
    let schema = leaf.schema();
    let table = Arc::clone(config.file_source.table_schema().table_schema());
    let filtered: Arc<dyn ExecutionPlan> = match config.file_source.filter() {
        Some(f) => Arc::new(FilterExec::try_new(
            reassign_expr_columns(f, &schema)?,
            leaf,
        )?),
        None => leaf,
    };
    let exprs: Vec<ProjectionExpr> = match config.file_source.projection() {
        Some(p) => p
            .iter()
            .map(|e| {
                // Projection expressions index the table schema.
                let expr = reassign_expr_columns(Arc::clone(&e.expr), &schema)?;
                Ok(ProjectionExpr {
                    expr,
                    alias: e.alias.clone(),
                })
            })
            .collect::<DfResult<_>>()?,
        None => table
            .fields()
            .iter()
            .map(|f| {
                let expr: Arc<dyn PhysicalExpr> = Arc::new(
                    datafusion::physical_expr::expressions::Column::new_with_schema(
                        f.name(),
                        &schema,
                    )?,
                );
                Ok(ProjectionExpr {
                    expr,
                    alias: f.name().clone(),
                })
            })
            .collect::<DfResult<_>>()?,
    };
    Ok(Arc::new(ProjectionExec::try_new(exprs, filtered)?))
}

/// One scan read once for several consumers in one task: whichever consumer
/// needs a batch polls the scan and queues the batch for the others. A
/// consumer that does not poll (a join still loading its build side) lets
/// its queue grow; the task's fragments then hold at most the scan's rows.
pub struct SharedScan {
    plan: Arc<dyn ExecutionPlan>,
    state: Mutex<SharedState>,
}

struct SharedState {
    stream: Option<SendableRecordBatchStream>,
    started: bool,
    queues: Vec<VecDeque<datafusion::arrow::array::RecordBatch>>,
    open: Vec<bool>,
    wakers: Vec<Option<Waker>>,
    done: bool,
    error: Option<Arc<DataFusionError>>,
    told: Vec<bool>,
}

impl fmt::Debug for SharedScan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedScan")
            .field("plan", &self.plan.name())
            .finish_non_exhaustive()
    }
}

impl SharedScan {
    fn new(plan: Arc<dyn ExecutionPlan>, consumers: usize) -> Self {
        SharedScan {
            plan,
            state: Mutex::new(SharedState {
                stream: None,
                started: false,
                queues: (0..consumers).map(|_| VecDeque::new()).collect(),
                open: vec![true; consumers],
                wakers: vec![None; consumers],
                done: false,
                error: None,
                told: vec![false; consumers],
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SharedState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Consumer `k` reads no more: nothing is queued for it, and the others
    /// are woken in case the scan would have woken only `k`.
    fn close(&self, k: usize) {
        let mut s = self.lock();
        s.open[k] = false;
        s.queues[k].clear();
        if s.open.iter().all(|o| !o) {
            s.stream = None;
        }
        for w in s.wakers.iter_mut() {
            if let Some(w) = w.take() {
                w.wake();
            }
        }
    }

    fn poll_for(
        &self,
        k: usize,
        ctx: &Arc<TaskContext>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<DfResult<datafusion::arrow::array::RecordBatch>>> {
        let mut s = self.lock();
        if let Some(b) = s.queues[k].pop_front() {
            return Poll::Ready(Some(Ok(b)));
        }
        if s.done {
            if let Some(e) = &s.error
                && !s.told[k]
            {
                let e = Arc::clone(e);
                s.told[k] = true;
                return Poll::Ready(Some(Err(DataFusionError::Shared(e))));
            }
            return Poll::Ready(None);
        }
        if !s.started {
            s.started = true;
            match self.plan.execute(0, Arc::clone(ctx)) {
                Ok(stream) => s.stream = Some(stream),
                Err(e) => return Poll::Ready(Some(Err(self.fail(&mut s, k, e)))),
            }
        }
        let Some(stream) = s.stream.as_mut() else {
            return Poll::Ready(None);
        };
        match stream.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(batch))) => {
                let s = &mut *s;
                for j in 0..s.queues.len() {
                    if j != k && s.open[j] {
                        s.queues[j].push_back(batch.clone());
                        if let Some(w) = s.wakers[j].take() {
                            w.wake();
                        }
                    }
                }
                Poll::Ready(Some(Ok(batch)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(self.fail(&mut s, k, e)))),
            Poll::Ready(None) => {
                s.done = true;
                s.stream = None;
                wake_all(&mut s);
                Poll::Ready(None)
            }
            Poll::Pending => {
                s.wakers[k] = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn fail(&self, s: &mut SharedState, k: usize, e: DataFusionError) -> DataFusionError {
        let e = Arc::new(e);
        s.done = true;
        s.stream = None;
        s.error = Some(Arc::clone(&e));
        s.told[k] = true;
        wake_all(s);
        DataFusionError::Shared(e)
    }
}

fn wake_all(s: &mut SharedState) {
    for w in s.wakers.iter_mut() {
        if let Some(w) = w.take() {
            w.wake();
        }
    }
}

/// A consumer's end of a [`SharedScan`]. The scan is shown as its child so
/// plan walks (naming a bad CSV row's file) still find it; it is executed
/// through the shared state, never as a child.
#[derive(Debug)]
pub struct SharedScanExec {
    shared: Arc<SharedScan>,
    consumer: usize,
    props: Arc<PlanProperties>,
}

impl SharedScanExec {
    fn new(shared: Arc<SharedScan>, consumer: usize) -> Self {
        let props = Arc::clone(shared.plan.properties());
        SharedScanExec {
            shared,
            consumer,
            props,
        }
    }
}

impl DisplayAs for SharedScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "SharedScanExec: consumer={}", self.consumer)
    }
}

impl ExecutionPlan for SharedScanExec {
    plan_basics!(
        |this| "SharedScanExec",
        &this.props,
        [&this.shared.plan],
        no_expressions
    );

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match children.as_slice() {
            [c] if Arc::ptr_eq(c, &self.shared.plan) => Ok(self),
            _ => Err(DataFusionError::Internal(
                "a shared scan cannot take another input".into(),
            )),
        }
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> DfResult<SendableRecordBatchStream> {
        if partition != 0 {
            return Err(DataFusionError::Internal(format!(
                "a shared scan has one partition, not {}",
                partition + 1
            )));
        }
        let stream = SharedStream {
            shared: Arc::clone(&self.shared),
            consumer: self.consumer,
            ctx,
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            stream,
        )))
    }
}

struct SharedStream {
    shared: Arc<SharedScan>,
    consumer: usize,
    ctx: Arc<TaskContext>,
}

impl Stream for SharedStream {
    type Item = DfResult<datafusion::arrow::array::RecordBatch>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        this.shared.poll_for(this.consumer, &this.ctx, cx)
    }
}

impl Drop for SharedStream {
    fn drop(&mut self) {
        self.shared.close(self.consumer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::source_reuse::reuse_groups;
    use crate::planning::split::{Exchange, Stage, StagePlan};
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
    use datafusion::config::CsvOptions;
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::FileGroup;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column, lit};
    use datafusion::physical_plan::limit::GlobalLimitExec;
    use datafusion::prelude::SessionContext;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("a", DataType::Int64, true),
            Field::new("b", DataType::Utf8, true),
        ]))
    }

    /// A CSV file of `rows` rows in a directory of its own (removed when
    /// the returned guard drops); its path and size.
    fn file(rows: usize, bad_row: Option<usize>) -> (tempfile::TempDir, String, u64) {
        let mut text = String::from("id,a,b\n");
        for i in 0..rows {
            if bad_row == Some(i) {
                text.push_str(&format!("{i},oops,x\n"));
            } else {
                text.push_str(&format!("{i},{},b{i}\n", i * 7));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("fluvia-reuse-")
            .tempdir()
            .unwrap();
        let path = dir.path().join("t.csv");
        std::fs::write(&path, &text).unwrap();
        let path = path.to_string_lossy().into_owned();
        (dir, path, text.len() as u64)
    }

    /// A one-partition scan of `path` by Fluvia's reader, keeping
    /// `columns`.
    fn scan(path: &str, size: u64, columns: Vec<usize>) -> Arc<dyn ExecutionPlan> {
        let options = CsvOptions {
            has_header: Some(true),
            ..Default::default()
        };
        let csv = CsvSource::new(schema()).with_csv_options(options);
        let config = FileScanConfigBuilder::new(ObjectStoreUrl::local_filesystem(), Arc::new(csv))
            .with_file_groups(vec![FileGroup::new(vec![PartitionedFile::new(
                path.to_string(),
                size,
            )])])
            .with_projection_indices(Some(columns))
            .unwrap()
            .build();
        FluviaCsvSource::wrap(DataSourceExec::from_data_source(config))
    }

    /// `id % 3 == k` over the scan's first column.
    fn every_third(input: Arc<dyn ExecutionPlan>, k: i64) -> Arc<dyn ExecutionPlan> {
        let pred = Arc::new(BinaryExpr::new(
            Arc::new(BinaryExpr::new(
                Arc::new(Column::new("id", 0)),
                Operator::Modulo,
                lit(3i64),
            )),
            Operator::Eq,
            lit(k),
        ));
        Arc::new(FilterExec::try_new(pred, input).unwrap())
    }

    /// Runs the plans at once, as a task runs its fragments: per plan, the
    /// rows it produced or its error.
    fn run_together(plans: &[Arc<dyn ExecutionPlan>]) -> Vec<DfResult<usize>> {
        let ctx = SessionContext::new().task_ctx();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let streams: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(i, p)| p.execute(0, Arc::clone(&ctx)).unwrap().map(move |b| (i, b)))
            .collect();
        let mut out: Vec<DfResult<usize>> = (0..plans.len()).map(|_| Ok(0)).collect();
        let mut all = futures::stream::select_all(streams);
        rt.block_on(async {
            while let Some((i, b)) = all.next().await {
                match (b, &mut out[i]) {
                    (Ok(b), Ok(n)) => *n += b.num_rows(),
                    (Err(e), slot @ Ok(_)) => *slot = Err(e),
                    (_, Err(_)) => {}
                }
            }
        });
        out
    }

    fn shared_leaves(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
        let mut out = Vec::new();
        plan.apply(|n| {
            if n.is::<SharedScanExec>() {
                out.push(Arc::clone(n));
            }
            Ok(TreeNodeRecursion::Continue)
        })
        .unwrap();
        out
    }

    #[test]
    fn consumers_of_one_scan_get_what_their_own_scans_give_and_the_file_is_read_once() {
        let (_dir, path, size) = file(20_000, None);
        let plans = vec![
            every_third(scan(&path, size, vec![0]), 0),
            every_third(scan(&path, size, vec![0, 1]), 1),
            every_third(scan(&path, size, vec![0, 2]), 2),
            scan(&path, size, vec![1]),
        ];
        let alone: Vec<usize> = plans
            .iter()
            .map(|p| *run_together(std::slice::from_ref(p))[0].as_ref().unwrap())
            .collect();
        let shared = share_scans(plans.clone()).unwrap();
        for (p, s) in plans.iter().zip(&shared) {
            assert_eq!(p.schema(), s.schema(), "each keeps its own columns");
            assert_eq!(shared_leaves(s).len(), 1);
        }
        let together: Vec<usize> = run_together(&shared)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(together, alone);
        assert_eq!(together, vec![6667, 6667, 6666, 20_000]);
        // One scan read the file, once, with the union of the columns.
        let leaf = &shared_leaves(&shared[0])[0];
        let inner = leaf.children()[0];
        assert!(Arc::ptr_eq(
            inner,
            shared_leaves(&shared[3])[0].children()[0]
        ));
        assert_eq!(inner.schema().fields().len(), 3);
        let read = inner.metrics().and_then(|m| m.output_rows());
        assert_eq!(read, Some(20_000));
    }

    /// `scan` with `id % 3 == k` as the reader's runtime filter.
    fn filtered_scan(path: &str, size: u64, columns: Vec<usize>, k: i64) -> Arc<dyn ExecutionPlan> {
        let plain = scan(path, size, columns);
        let config = plain
            .downcast_ref::<DataSourceExec>()
            .and_then(|d| d.data_source().downcast_ref::<FileScanConfig>())
            .unwrap();
        let source = config
            .file_source
            .downcast_ref::<FluviaCsvSource>()
            .unwrap()
            .clone();
        let id_mod_3 = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("id", 0)),
            Operator::Modulo,
            lit(3i64),
        ));
        let pred: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(id_mod_3, Operator::Eq, lit(k)));
        let source: Arc<dyn FileSource> = Arc::new(source.with_predicate(Some(pred)));
        DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(config.clone())
                .with_source(source)
                .build(),
        )
    }

    #[test]
    fn the_shared_scan_keeps_what_any_consumer_keeps_and_each_applies_its_own_filter() {
        let (_dir, path, size) = file(9_000, None);
        let plans = vec![
            filtered_scan(&path, size, vec![1], 0),
            filtered_scan(&path, size, vec![2], 1),
        ];
        let shared = share_scans(plans).unwrap();
        let rows: Vec<usize> = run_together(&shared)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(rows, vec![3_000, 3_000]);
        let inner = Arc::clone(shared_leaves(&shared[0])[0].children()[0]);
        let read = inner.metrics().and_then(|m| m.output_rows());
        assert_eq!(
            read,
            Some(6_000),
            "rows of neither filter are dropped in the scan"
        );
    }

    #[test]
    fn values_are_the_same_through_a_shared_scan() {
        let (_dir, path, size) = file(5_000, None);
        let plans = vec![scan(&path, size, vec![1]), scan(&path, size, vec![1, 0])];
        let shared = share_scans(plans).unwrap();
        let ctx = SessionContext::new().task_ctx();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batches = rt
            .block_on(datafusion::physical_plan::collect(
                Arc::clone(&shared[0]),
                Arc::clone(&ctx),
            ))
            .unwrap();
        let a: Vec<i64> = batches
            .iter()
            .flat_map(|b| {
                let c = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
                (0..c.len()).map(|i| c.value(i)).collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(a, (0..5_000).map(|i| i * 7).collect::<Vec<i64>>());
    }

    #[test]
    fn a_consumer_that_stops_early_holds_up_no_other() {
        let (_dir, path, size) = file(50_000, None);
        let limited: Arc<dyn ExecutionPlan> = Arc::new(GlobalLimitExec::new(
            scan(&path, size, vec![0]),
            0,
            Some(10),
        ));
        let plans = vec![limited, scan(&path, size, vec![2])];
        let shared = share_scans(plans).unwrap();
        assert_eq!(shared_leaves(&shared[0]).len(), 1);
        let rows: Vec<usize> = run_together(&shared)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(rows, vec![10, 50_000]);
    }

    #[test]
    fn a_bad_row_fails_every_consumer_with_the_readers_message() {
        let (_dir, path, size) = file(30_000, Some(25_000));
        let plans = vec![scan(&path, size, vec![1]), scan(&path, size, vec![0, 1])];
        let shared = share_scans(plans).unwrap();
        for r in run_together(&shared) {
            let e = r.unwrap_err().to_string();
            assert!(e.contains("Error while parsing value 'oops'"), "{e}");
        }
    }

    fn stage(plan: Arc<dyn ExecutionPlan>, consumer: Option<usize>, inputs: Vec<usize>) -> Stage {
        Stage {
            plan,
            parallelism: 1,
            exchange: Exchange::Global { offset: 0 },
            hash_exprs: Vec::new(),
            consumer,
            inputs,
        }
    }

    #[test]
    fn stages_that_feed_each_other_are_never_one_task() {
        let (_dir, path, size) = file(100, None);
        let (_other_dir, other, other_size) = file(100, None);
        // 0 -> 1 -> 4 (root), 2 -> 4, 3 -> 4: 0, 1 and 2 scan `path`, 3
        // another file. 1 reads 0's output, so only one of them joins 2.
        let plan = StagePlan {
            stages: vec![
                stage(scan(&path, size, vec![0]), Some(1), vec![]),
                stage(scan(&path, size, vec![1]), Some(4), vec![0]),
                stage(scan(&path, size, vec![2]), Some(4), vec![]),
                stage(scan(&other, other_size, vec![0]), Some(4), vec![]),
                stage(scan(&path, size, vec![0]), None, vec![1, 2, 3]),
            ],
        };
        let groups = reuse_groups(&plan, 0);
        assert_eq!(groups.len(), 1, "{groups:?}");
        assert_eq!(groups[0].stages, vec![0, 2]);
        assert!(!groups[0].small_outputs, "scans emit every row");
        assert!(reuse_groups(&plan, size + 1).is_empty(), "below the size");
    }
}
