//! Helpers of the crate's unit tests.

use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use std::path::Path;
use std::sync::Arc;

/// Registers the Parquet files at `path` as table `name` of `ctx`.
pub(crate) async fn register_parquet(ctx: &SessionContext, name: &str, path: &Path) {
    let path = path.to_str().unwrap();
    ctx.register_parquet(name, path, ParquetReadOptions::default())
        .await
        .unwrap();
}

/// The physical plan DataFusion makes of `sql` in `ctx`.
pub(crate) async fn physical_plan(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
    let df = ctx.sql(sql).await.unwrap();
    df.create_physical_plan().await.unwrap()
}
