//! Joins on a scalar subquery moved down to the table whose column they
//! compare, a logical rule run after DataFusion's filter pushdown.
//!
//! Fluvia plans scalar subqueries as joins (an in-process container cannot
//! cross tasks), and DataFusion's `scalar_subquery_to_join` puts that join
//! on top of the whole FROM list: in TPC-DS q6,
//! `d.d_month_seq = (SELECT DISTINCT d_month_seq …)` filters only after
//! `store_sales` was joined with `customer`, `date_dim` and `item`, so two
//! million rows cross two joins that 2 % of them survive. DataFusion alone
//! evaluates the subquery first and filters `date_dim` in its scan.
//!
//! An inner join's inputs can be regrouped freely, so the rule moves an
//! inner equi-join whose right side is a decorrelated scalar subquery (the
//! `__scalar_sq_N` alias DataFusion gives it) down through inner joins and
//! plain projections to the smallest input that holds every column its
//! keys read, and puts a projection on top that restores the join's
//! columns in their order. Only where its keys are plain columns and it
//! carries no other filter. Knows DataFusion's logical plans only.

use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result as DfResult};
use datafusion::logical_expr::{Expr, Join, JoinType, LogicalPlan, Projection};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};
use std::sync::Arc;

/// The alias prefix of DataFusion's decorrelated scalar subqueries.
const SCALAR_SUBQUERY_ALIAS: &str = "__scalar_sq";

/// The rule (the module doc).
#[derive(Debug, Default)]
pub struct PushScalarSubqueryJoins;

impl OptimizerRule for PushScalarSubqueryJoins {
    fn name(&self) -> &str {
        "push_scalar_subquery_joins"
    }

    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::TopDown)
    }

    fn rewrite(
        &self,
        plan: LogicalPlan,
        _config: &dyn OptimizerConfig,
    ) -> DfResult<Transformed<LogicalPlan>> {
        let LogicalPlan::Join(join) = &plan else {
            return Ok(Transformed::no(plan));
        };
        if join.join_type != JoinType::Inner
            || join.filter.is_some()
            || join.on.is_empty()
            || !is_scalar_subquery(&join.right)
        {
            return Ok(Transformed::no(plan));
        }
        let Some(keys) = join
            .on
            .iter()
            .map(|(l, _)| match l {
                Expr::Column(c) => Some(c.clone()),
                _ => None,
            })
            .collect::<Option<Vec<Column>>>()
        else {
            return Ok(Transformed::no(plan));
        };
        let Some(pushed) = push(&join.left, &keys, join)? else {
            return Ok(Transformed::no(plan));
        };
        // The join's own columns, in its order, over the regrouped inputs.
        let columns = join
            .schema
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect();
        let restored = Projection::try_new(columns, Arc::new(pushed))?;
        Ok(Transformed::yes(LogicalPlan::Projection(restored)))
    }
}

/// Whether `plan` is a scalar subquery decorrelated into a join input.
fn is_scalar_subquery(plan: &LogicalPlan) -> bool {
    matches!(plan, LogicalPlan::SubqueryAlias(a) if a.alias.table().starts_with(SCALAR_SUBQUERY_ALIAS))
}

/// `plan` with `join`'s right side joined in below it, at the deepest input
/// of its inner joins that holds all `keys`; `None` where `plan` is no
/// inner join or projection to go through (the join stays where it is).
fn push(plan: &LogicalPlan, keys: &[Column], join: &Join) -> DfResult<Option<LogicalPlan>> {
    match plan {
        LogicalPlan::Join(inner) if inner.join_type == JoinType::Inner => {
            let holds = |p: &LogicalPlan| keys.iter().all(|k| p.schema().has_column(k));
            let (left, right) = if holds(&inner.left) {
                (at(&inner.left, keys, join)?, Arc::clone(&inner.right))
            } else if holds(&inner.right) {
                (Arc::clone(&inner.left), at(&inner.right, keys, join)?)
            } else {
                return Ok(None);
            };
            Ok(Some(LogicalPlan::Join(Join::try_new(
                left,
                right,
                inner.on.clone(),
                inner.filter.clone(),
                inner.join_type,
                inner.join_constraint,
                inner.null_equality,
                inner.null_aware,
            )?)))
        }
        LogicalPlan::Projection(p) => {
            // Only through a projection that passes the keys on unchanged.
            if !keys
                .iter()
                .all(|k| p.expr.contains(&Expr::Column(k.clone())))
            {
                return Ok(None);
            }
            let Some(input) = push(&p.input, keys, join)? else {
                return Ok(None);
            };
            let mut expr = p.expr.clone();
            expr.extend(join.right.schema().columns().into_iter().map(Expr::Column));
            Ok(Some(LogicalPlan::Projection(Projection::try_new(
                expr,
                Arc::new(input),
            )?)))
        }
        _ => Ok(None),
    }
}

/// `input` with `join`'s right side joined in: deeper where it can go,
/// here otherwise.
fn at(input: &Arc<LogicalPlan>, keys: &[Column], join: &Join) -> DfResult<Arc<LogicalPlan>> {
    if let Some(deeper) = push(input, keys, join)? {
        return Ok(Arc::new(deeper));
    }
    Ok(Arc::new(LogicalPlan::Join(Join::try_new(
        Arc::clone(input),
        Arc::clone(&join.right),
        join.on.clone(),
        None,
        JoinType::Inner,
        join.join_constraint,
        join.null_equality,
        false,
    )?)))
}

#[cfg(test)]
mod tests {
    use crate::job::planning_context;
    use datafusion::arrow::array::{ArrayRef, Int64Array};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::arrow::util::pretty::pretty_format_batches;
    use datafusion::datasource::MemTable;
    use datafusion::prelude::SessionContext;
    use fluvia_core::config::Configuration;
    use std::sync::Arc;

    /// A fact table joined with two dimensions, one of them filtered by a
    /// scalar subquery on its own column (TPC-DS q6's shape).
    const SQL: &str = "SELECT f.v, d.m, e.n FROM fact f, dim d, other e \
         WHERE f.dk = d.k AND f.ek = e.k \
         AND d.m = (SELECT DISTINCT m FROM dim WHERE k = 3) \
         ORDER BY f.v";

    /// A table of Int64 columns `names`, one `Vec` of values per column.
    fn table(names: &[&str], columns: Vec<Vec<i64>>) -> Arc<MemTable> {
        let schema = Arc::new(Schema::new(
            names
                .iter()
                .map(|n| Field::new(*n, DataType::Int64, false))
                .collect::<Vec<_>>(),
        ));
        let columns = columns
            .into_iter()
            .map(|c| Arc::new(Int64Array::from(c)) as ArrayRef)
            .collect();
        let batch = RecordBatch::try_new(Arc::clone(&schema), columns).expect("batch");
        Arc::new(MemTable::try_new(schema, vec![vec![batch]]).expect("table"))
    }

    fn context(push: bool) -> SessionContext {
        // Fluvia's settings: the subquery planned as a join.
        let options =
            crate::session::datafusion_options(2, &Configuration::default()).expect("options");
        let ctx = planning_context(&options, push).expect("context");
        // fact: v in 0..40 with dk = v % 10 and ek = v % 4; dim: m = k / 2.
        let v: Vec<i64> = (0..40).collect();
        let fact = table(
            &["dk", "ek", "v"],
            vec![
                v.iter().map(|v| v % 10).collect(),
                v.iter().map(|v| v % 4).collect(),
                v.clone(),
            ],
        );
        ctx.register_table("fact", fact).expect("fact");
        let k: Vec<i64> = (0..10).collect();
        let dim = table(
            &["k", "m"],
            vec![k.clone(), k.iter().map(|k| k / 2).collect()],
        );
        ctx.register_table("dim", dim).expect("dim");
        let k: Vec<i64> = (0..4).collect();
        let other = table(
            &["k", "n"],
            vec![k.clone(), k.iter().map(|k| 100 + k).collect()],
        );
        ctx.register_table("other", other).expect("other");
        ctx
    }

    fn run(push: bool) -> (String, String) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let df = context(push).sql(SQL).await.expect("sql");
            let plan = df.clone().into_optimized_plan().expect("plan");
            let rows = df.collect().await.expect("rows");
            (
                plan.display_indent().to_string(),
                pretty_format_batches(&rows).expect("format").to_string(),
            )
        })
    }

    #[test]
    fn scalar_subquery_join_moves_down_to_its_table_with_the_same_rows() {
        let (pushed, pushed_rows) = run(true);
        let (kept, kept_rows) = run(false);
        // The rows: those of dim keys 2 and 3 (m = 1), each with its `other`.
        assert_eq!(pushed_rows, kept_rows);
        assert_eq!(pushed_rows.matches("| 1 |").count(), 8, "{pushed_rows}");

        let depth = |plan: &str, what: &str| {
            plan.lines()
                .find(|l| l.contains(what))
                .map(|l| l.len() - l.trim_start().len())
                .unwrap_or_else(|| panic!("no '{what}' in\n{plan}"))
        };
        // Without the rule the subquery's join is above the fact table's
        // joins; with it, below both, right above the dimension's scan.
        let sq = "d.m = __scalar_sq_1.m";
        assert!(depth(&kept, sq) < depth(&kept, "f.dk = d.k"), "{kept}");
        assert!(
            depth(&pushed, sq) > depth(&pushed, "f.dk = d.k"),
            "{pushed}"
        );
        assert!(
            depth(&pushed, sq) > depth(&pushed, "f.ek = e.k"),
            "{pushed}"
        );
    }
}
