//! Where a closure-free JobGraph finds its user code: one
//! [`OperatorFactory`] per StreamGraph node and per-edge data (a keyed edge's
//! key hasher, a SQL edge's producing fragment),
//! registered by the API that built the graph. Every process that runs the
//! job builds the same registry from the same program.

use crate::operator::{OperatorFactory, RecordType};
use crate::output::KeyHasher;
use crate::record::Data;
use fluvia_core::{FluviaError, Result};
use fluvia_graph::StreamNodeId;
use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Default, Clone)]
pub struct OperatorRegistry {
    factories: BTreeMap<StreamNodeId, Arc<dyn OperatorFactory>>,
    edge_data: BTreeMap<usize, Arc<dyn Any + Send + Sync>>,
    /// (producing node, output tag) → the side output's record type.
    side_output_types: BTreeMap<(StreamNodeId, String), Arc<dyn RecordType>>,
}

debug_fields!(OperatorRegistry, |s| {
    operators: s.factories.len(),
    edge_data: s.edge_data.len(),
});

impl OperatorRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, node: StreamNodeId, factory: Arc<dyn OperatorFactory>) {
        self.factories.insert(node, factory);
    }

    /// The key hash function of keyed stream edge `edge`, for records `T`.
    pub fn register_key_hasher<T: Data>(&mut self, edge: usize, hasher: KeyHasher<T>) {
        self.edge_data.insert(edge, Arc::new(hasher));
    }

    /// Data the record type of stream edge `edge` is given when it builds
    /// the edge's network output (what the producer routes to it).
    pub fn register_edge_data(&mut self, edge: usize, data: Arc<dyn Any + Send + Sync>) {
        self.edge_data.insert(edge, data);
    }

    /// Node `node` emits records of `record_type` under side output `tag`.
    pub fn register_side_output(
        &mut self,
        node: StreamNodeId,
        tag: &str,
        record_type: Arc<dyn RecordType>,
    ) {
        self.side_output_types
            .insert((node, tag.to_string()), record_type);
    }

    /// The record type of side output `tag` of node `node`.
    pub fn side_output_type(&self, node: StreamNodeId, tag: &str) -> Result<&Arc<dyn RecordType>> {
        self.side_output_types
            .get(&(node, tag.to_string()))
            .ok_or_else(|| {
                FluviaError::Plan(format!(
                    "stream node {node} has no side output '{tag}' in this program"
                ))
            })
    }

    pub fn factory(&self, node: StreamNodeId) -> Result<&Arc<dyn OperatorFactory>> {
        self.factories.get(&node).ok_or_else(|| {
            FluviaError::Plan(format!(
                "no operator is registered for stream node {node}: the job graph does not \
                 come from this program"
            ))
        })
    }

    pub fn key_hasher(&self, edge: usize) -> Option<&Arc<dyn Any + Send + Sync>> {
        self.edge_data.get(&edge)
    }
}
