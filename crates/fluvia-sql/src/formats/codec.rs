//! Fragments as bytes: datafusion-proto for DataFusion's operators, and an
//! extension codec for Fluvia's exchange reader and CSV scan, so any
//! TaskManager can rebuild a fragment without the SQL, the catalog or the
//! planner.

use crate::exec::exchange::{ExchangeReaderExec, ReaderFacts};
use crate::formats::csv_scan::FluviaCsvSource;
use datafusion::arrow::compute::SortOptions;
use datafusion::arrow::datatypes::Schema;
use datafusion::datasource::physical_plan::{
    CsvSource, FileScanConfig, FileScanConfigBuilder, FileSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_expr::{LexOrdering, PhysicalExpr, PhysicalSortExpr};
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::from_proto::parse_physical_expr;
use datafusion_proto::physical_plan::to_proto::serialize_physical_expr;
use datafusion_proto::physical_plan::{
    PhysicalExtensionCodec, PhysicalPlanDecodeContext, PhysicalPlanNodeExt,
    PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct FluviaCodec;

/// The first byte of an extension node: which of Fluvia's operators.
const EXCHANGE_READER: u8 = 0;
const CSV_SCAN: u8 = 1;

impl PhysicalExtensionCodec for FluviaCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        _inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        c: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        match buf.split_first() {
            Some((&EXCHANGE_READER, rest)) => self.decode_reader(rest, ctx),
            Some((&CSV_SCAN, rest)) => self.decode_csv_scan(rest, ctx, c),
            _ => Err(DataFusionError::Internal(
                "unknown Fluvia operator in a fragment".into(),
            )),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        c: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        if let Some(r) = node.downcast_ref::<ExchangeReaderExec>() {
            buf.push(EXCHANGE_READER);
            return self.encode_reader(r, buf);
        }
        if let Some(config) = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|ds| ds.data_source().downcast_ref::<FileScanConfig>())
            && let Some(csv) = config.file_source.downcast_ref::<FluviaCsvSource>()
        {
            buf.push(CSV_SCAN);
            return self.encode_csv_scan(config, csv, buf, c);
        }
        Err(DataFusionError::NotImplemented(format!(
            "{} cannot be shipped to a TaskManager",
            node.name()
        )))
    }
}

impl FluviaCodec {
    /// DataFusion's CSV scan as datafusion-proto writes it, and the runtime
    /// filter beside it.
    fn encode_csv_scan(
        &self,
        config: &FileScanConfig,
        csv: &FluviaCsvSource,
        buf: &mut Vec<u8>,
        c: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let inner: Arc<dyn FileSource> = Arc::new(csv.inner().clone());
        let plan = DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(config.clone())
                .with_source(inner)
                .build(),
        );
        let node =
            protobuf::PhysicalPlanNode::try_from_physical_plan_with_converter(plan, self, c)?;
        put_chunk(buf, &node.encode_to_vec());
        match csv.predicate() {
            None => put_u32(buf, 0),
            Some(p) => {
                put_u32(buf, 1);
                put_chunk(buf, &c.physical_expr_to_proto(p, self)?.encode_to_vec());
            }
        }
        Ok(())
    }

    fn decode_csv_scan(
        &self,
        buf: &[u8],
        ctx: &TaskContext,
        c: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut r = Reader { buf, pos: 0 };
        let node = protobuf::PhysicalPlanNode::decode(r.chunk()?)
            .map_err(|e| DataFusionError::Internal(format!("CSV scan: {e}")))?;
        let decode = PhysicalPlanDecodeContext::new(ctx, self);
        let plan = c.proto_to_execution_plan(&node, &decode)?;
        let Some(config) = plan
            .downcast_ref::<DataSourceExec>()
            .and_then(|ds| ds.data_source().downcast_ref::<FileScanConfig>())
        else {
            return Err(DataFusionError::Internal(
                "CSV scan without its files".into(),
            ));
        };
        let Some(csv) = config.file_source.downcast_ref::<CsvSource>() else {
            return Err(DataFusionError::Internal(
                "CSV scan of another format".into(),
            ));
        };
        let predicate = match r.u32()? {
            0 => None,
            _ => {
                let node = protobuf::PhysicalExprNode::decode(r.chunk()?)
                    .map_err(|e| DataFusionError::Internal(format!("CSV scan filter: {e}")))?;
                let schema = csv.table_schema().table_schema();
                Some(c.proto_to_physical_expr(&node, schema, &decode)?)
            }
        };
        let source: Arc<dyn FileSource> =
            Arc::new(FluviaCsvSource::new(csv.clone()).with_predicate(predicate));
        Ok(DataSourceExec::from_data_source(
            FileScanConfigBuilder::from(config.clone())
                .with_source(source)
                .build(),
        ))
    }

    fn decode_reader(&self, buf: &[u8], ctx: &TaskContext) -> DfResult<Arc<dyn ExecutionPlan>> {
        let mut r = Reader { buf, pos: 0 };
        let stage = r.u32()? as usize;
        let partitions = r.u32()? as usize;
        let proto = protobuf::Schema::decode(r.chunk()?)
            .map_err(|e| DataFusionError::Internal(format!("exchange reader schema: {e}")))?;
        let schema: Schema = (&proto)
            .try_into()
            .map_err(|e| DataFusionError::Internal(format!("exchange reader schema: {e}")))?;
        let expr = |r: &mut Reader| -> DfResult<Arc<dyn PhysicalExpr>> {
            let node = protobuf::PhysicalExprNode::decode(r.chunk()?)
                .map_err(|e| DataFusionError::Internal(format!("exchange reader: {e}")))?;
            parse_physical_expr(&node, ctx, &schema, self)
        };
        let hash = match r.u32()? {
            0 => None,
            n => Some(
                (0..n - 1)
                    .map(|_| expr(&mut r))
                    .collect::<DfResult<Vec<_>>>()?,
            ),
        };
        let constants = (0..r.u32()?)
            .map(|_| expr(&mut r))
            .collect::<DfResult<Vec<_>>>()?;
        let mut classes = Vec::new();
        for _ in 0..r.u32()? {
            classes.push(
                (0..r.u32()?)
                    .map(|_| expr(&mut r))
                    .collect::<DfResult<Vec<_>>>()?,
            );
        }
        let ordering = match r.u32()? {
            0 => None,
            n => {
                let mut sort = Vec::new();
                for _ in 0..n - 1 {
                    let flags = r.u32()?;
                    let options = SortOptions {
                        descending: flags & 1 != 0,
                        nulls_first: flags & 2 != 0,
                    };
                    sort.push(PhysicalSortExpr::new(expr(&mut r)?, options));
                }
                LexOrdering::new(sort)
            }
        };
        let facts = ReaderFacts {
            hash,
            constants,
            classes,
            ordering,
        };
        Ok(Arc::new(ExchangeReaderExec::new(
            stage,
            Arc::new(schema),
            partitions,
            facts,
        )?))
    }

    fn encode_reader(&self, r: &ExchangeReaderExec, buf: &mut Vec<u8>) -> DfResult<()> {
        put_u32(buf, r.stage() as u32);
        put_u32(buf, r.partitions() as u32);
        let proto: protobuf::Schema = r
            .schema()
            .as_ref()
            .try_into()
            .map_err(|e| DataFusionError::Internal(format!("exchange reader schema: {e}")))?;
        put_chunk(buf, &proto.encode_to_vec());
        let expr = |buf: &mut Vec<u8>, e: &Arc<dyn PhysicalExpr>| -> DfResult<()> {
            let node = serialize_physical_expr(e, self)?;
            put_chunk(buf, &node.encode_to_vec());
            Ok(())
        };
        let facts = r.facts();
        match &facts.hash {
            None => put_u32(buf, 0),
            Some(exprs) => {
                put_u32(buf, exprs.len() as u32 + 1);
                for e in exprs {
                    expr(buf, e)?;
                }
            }
        }
        put_u32(buf, facts.constants.len() as u32);
        for e in &facts.constants {
            expr(buf, e)?;
        }
        put_u32(buf, facts.classes.len() as u32);
        for class in &facts.classes {
            put_u32(buf, class.len() as u32);
            for e in class {
                expr(buf, e)?;
            }
        }
        match &facts.ordering {
            None => put_u32(buf, 0),
            Some(ordering) => {
                put_u32(buf, ordering.len() as u32 + 1);
                for s in ordering.iter() {
                    let flags =
                        u32::from(s.options.descending) | (u32::from(s.options.nulls_first) << 1);
                    put_u32(buf, flags);
                    expr(buf, &s.expr)?;
                }
            }
        }
        Ok(())
    }
}

fn put_u32(buf: &mut Vec<u8>, v: u32) {
    buf.extend_from_slice(&v.to_le_bytes());
}

fn put_chunk(buf: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(buf, bytes.len() as u32);
    buf.extend_from_slice(bytes);
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> DfResult<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| DataFusionError::Internal("truncated exchange reader".into()))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn u32(&mut self) -> DfResult<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn chunk(&mut self) -> DfResult<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}
