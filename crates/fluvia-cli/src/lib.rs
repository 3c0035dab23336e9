//! The jobs behind `fluvia run` and `fluvia explain`, as a library so that
//! benchmarks and tests build exactly the jobs users run.
//!
//! Each example builds its job on a [`StreamExecutionEnvironment`] given to
//! it; the binary (`main.rs`) only parses arguments and prints.
//!
//! [`StreamExecutionEnvironment`]: fluvia_datastream::StreamExecutionEnvironment

pub mod catalog;
pub mod examples;
pub mod sql;
