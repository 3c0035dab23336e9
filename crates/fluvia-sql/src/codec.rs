//! Fragments as bytes: datafusion-proto for DataFusion's operators, and an
//! extension codec for Fluvia's exchange reader, so any TaskManager can
//! rebuild a fragment without the SQL, the catalog or the planner.

use crate::exchange::ExchangeReaderExec;
use datafusion::arrow::datatypes::Schema;
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_proto::physical_plan::{PhysicalExtensionCodec, PhysicalProtoConverterExtension};
use datafusion_proto::protobuf;
use prost::Message;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct FluviaCodec;

impl PhysicalExtensionCodec for FluviaCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        _inputs: &[Arc<dyn ExecutionPlan>],
        _ctx: &TaskContext,
        _c: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        let bad = || DataFusionError::Internal("malformed exchange reader".into());
        if buf.len() < 8 {
            return Err(bad());
        }
        let stage = u32::from_le_bytes(buf[0..4].try_into().map_err(|_| bad())?) as usize;
        let partitions = u32::from_le_bytes(buf[4..8].try_into().map_err(|_| bad())?) as usize;
        let proto = protobuf::Schema::decode(&buf[8..])
            .map_err(|e| DataFusionError::Internal(format!("exchange reader schema: {e}")))?;
        let schema: Schema = (&proto)
            .try_into()
            .map_err(|e| DataFusionError::Internal(format!("exchange reader schema: {e}")))?;
        Ok(Arc::new(ExchangeReaderExec::new(
            stage,
            Arc::new(schema),
            partitions,
        )))
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        _c: &dyn PhysicalProtoConverterExtension,
    ) -> DfResult<()> {
        let Some(r) = node.downcast_ref::<ExchangeReaderExec>() else {
            return Err(DataFusionError::NotImplemented(format!(
                "{} cannot be shipped to a TaskManager",
                node.name()
            )));
        };
        buf.extend_from_slice(&(r.stage() as u32).to_le_bytes());
        buf.extend_from_slice(&(r.partitions() as u32).to_le_bytes());
        let proto: protobuf::Schema = r
            .schema()
            .as_ref()
            .try_into()
            .map_err(|e| DataFusionError::Internal(format!("exchange reader schema: {e}")))?;
        buf.extend_from_slice(&proto.encode_to_vec());
        Ok(())
    }
}
