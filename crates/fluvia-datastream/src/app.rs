//! Application mode for your own crate: the program's binary is the client
//! and the TaskManager of its own jobs.
//!
//! Closures cannot travel over the network, so every process of a job
//! rebuilds the job from the program's arguments with the same code: the
//! client submits the JobGraph (as data) to a stock `fluvia jobmanager`,
//! which places its tasks only on TaskManagers whose program fingerprint is
//! this binary's — `PROG taskmanager --jobmanager HOST:PORT` started from
//! the same build. One session cluster can serve several programs side by
//! side, and stock `fluvia taskmanager`s beside them serve SQL and the
//! built-in examples.
//!
//! ```no_run
//! use fluvia_datastream::prelude::*;
//!
//! fn build(
//!     env: &StreamExecutionEnvironment,
//!     args: &[String],
//! ) -> Result<CollectHandle<i64>, UserError> {
//!     let n: i64 = args.first().map(|a| a.parse()).transpose()?.unwrap_or(10);
//!     Ok(env.from_sequence(1, n).map(|x| x * x).collect().1)
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     fluvia_datastream::app::main(fluvia_datastream::program!(), build, |_result, squares| {
//!         println!("{} squares", squares.take().len());
//!         Ok(())
//!     })
//! }
//! ```
//!
//! Command lines such a binary takes:
//! - `PROG [--jobmanager HOST:PORT] [-D KEY=VALUE]... ARGS...`: builds the
//!   job from `ARGS` and runs it on that cluster, or on the embedded
//!   mini-cluster without `--jobmanager`; `-D` keys configure the job (and
//!   are part of what every process rebuilds it from).
//! - `PROG taskmanager --jobmanager HOST:PORT [--slots N] [-D KEY=VALUE]...`:
//!   serves this program's jobs until stopped.

use crate::env::{Application, StreamExecutionEnvironment};
use fluvia_cluster::program::{ProgramCatalog, ProgramSpec};
use fluvia_core::{Configuration, FluviaError, Result, StableHasher};
use fluvia_graph::JobGraph;
use fluvia_runtime::{JobExecutionResult, OperatorRegistry, UserError};
use std::process::ExitCode;
use std::sync::Arc;

/// A program's identity: its crate name and version ([`crate::program!`]).
#[derive(Debug, Clone, Copy)]
pub struct Program {
    pub name: &'static str,
    pub version: &'static str,
}

impl Program {
    /// Identifies this build's programs: TaskManagers started from a binary
    /// with another name or version do not get its jobs.
    pub fn fingerprint(&self) -> String {
        let mut h = StableHasher::new();
        h.write_str("application")
            .write_str(self.name)
            .write_str(self.version)
            .write_str(env!("CARGO_PKG_VERSION"));
        format!("{:032x}", h.finish128())
    }
}

/// The calling crate as a [`Program`] (its Cargo name and version).
#[macro_export]
macro_rules! program {
    () => {
        $crate::app::Program {
            name: env!("CARGO_PKG_NAME"),
            version: env!("CARGO_PKG_VERSION"),
        }
    };
}

/// Builds the job on `env` from the program's arguments and returns what the
/// program reads afterwards (collect handles). Every process calls it with
/// the same arguments: it must build the same job each time.
pub type Build<H> = fn(&StreamExecutionEnvironment, &[String]) -> std::result::Result<H, UserError>;

/// `-D KEY=VALUE` pairs and the remaining program arguments.
fn split_dynamic(args: &[String]) -> Result<(Vec<String>, Vec<String>)> {
    let mut dynamic = Vec::new();
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "-D" {
            let kv = it
                .next()
                .ok_or_else(|| FluviaError::Config("-D needs KEY=VALUE".into()))?;
            dynamic.push(kv.clone());
        } else if let Some(kv) = a.strip_prefix("-D").filter(|kv| kv.contains('=')) {
            dynamic.push(kv.to_string());
        } else {
            rest.push(a.clone());
        }
    }
    Ok((dynamic, rest))
}

fn environment(dynamic: &[String]) -> Result<StreamExecutionEnvironment> {
    let mut config = Configuration::new();
    config.apply_dynamic(dynamic)?;
    StreamExecutionEnvironment::with_config(config)
}

fn user(e: UserError) -> FluviaError {
    FluviaError::Plan(e.to_string())
}

/// The program as the TaskManager's catalog: a job's spec holds the
/// program's arguments, from which it rebuilds the job.
struct AppCatalog<H> {
    program: Program,
    build: Build<H>,
}

impl<H: 'static> ProgramCatalog for AppCatalog<H> {
    fn build(&self, spec: &ProgramSpec) -> Result<(JobGraph, OperatorRegistry)> {
        if spec.name != self.program.name {
            return Err(FluviaError::Plan(format!(
                "this TaskManager carries program '{}', not '{}'",
                self.program.name, spec.name
            )));
        }
        let (dynamic, rest) = split_dynamic(&spec.args)?;
        let env = environment(&dynamic)?;
        (self.build)(&env, &rest).map_err(user)?;
        Ok((env.job_graph(self.program.name)?, env.registry()))
    }

    fn fingerprint(&self) -> String {
        self.program.fingerprint()
    }
}

/// The program's `main`: runs the job (or a TaskManager) as the command
/// line says, then hands the result and the handles to `finish`.
pub fn main<H: 'static>(
    program: Program,
    build: Build<H>,
    finish: impl FnOnce(JobExecutionResult, H) -> std::result::Result<(), UserError>,
) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(program, build, finish, &args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: {e}", program.name);
            ExitCode::FAILURE
        }
    }
}

fn run<H: 'static>(
    program: Program,
    build: Build<H>,
    finish: impl FnOnce(JobExecutionResult, H) -> std::result::Result<(), UserError>,
    args: &[String],
) -> Result<()> {
    let mut jobmanager = None;
    let mut slots = None;
    let mut spec_args = Vec::new();
    let taskmanager = args.first().is_some_and(|a| a == "taskmanager");
    let mut it = args.iter().skip(usize::from(taskmanager));
    while let Some(a) = it.next() {
        match a.as_str() {
            "--jobmanager" => {
                jobmanager =
                    Some(it.next().cloned().ok_or_else(|| {
                        FluviaError::Config("--jobmanager needs HOST:PORT".into())
                    })?);
            }
            "--slots" if taskmanager => {
                slots = Some(
                    it.next()
                        .cloned()
                        .ok_or_else(|| FluviaError::Config("--slots needs a number".into()))?,
                );
            }
            _ => spec_args.push(a.clone()),
        }
    }
    if taskmanager {
        let address = jobmanager.ok_or_else(|| {
            FluviaError::Config(format!(
                "usage: {} taskmanager --jobmanager HOST:PORT [--slots N] [-D KEY=VALUE]...",
                program.name
            ))
        })?;
        let (mut dynamic, rest) = split_dynamic(&spec_args)?;
        if let Some(extra) = rest.first() {
            return Err(FluviaError::Config(format!(
                "unexpected argument '{extra}' for taskmanager"
            )));
        }
        if let Some(n) = slots {
            dynamic.push(format!("taskmanager.numberOfTaskSlots={n}"));
        }
        let config = fluvia_cluster::config::load(None, &dynamic)?;
        let catalog = Arc::new(AppCatalog { program, build });
        // The same runtime as a stock `fluvia taskmanager`.
        return fluvia_cluster::block_on(fluvia_cluster::taskmanager::run(
            &address, config, catalog,
        ))?;
    }
    let (dynamic, rest) = split_dynamic(&spec_args)?;
    let env = environment(&dynamic)?;
    env.set_application(Application {
        spec: ProgramSpec {
            name: program.name.to_string(),
            args: spec_args,
        },
        fingerprint: program.fingerprint(),
        jobmanager,
    });
    let handles = build(&env, &rest).map_err(user)?;
    let result = env.execute(program.name)?;
    finish(result, handles).map_err(|e| FluviaError::Execution(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dynamic_keys_are_split_from_program_arguments() {
        let args: Vec<String> = ["-D", "a=1", "file.txt", "-Db=2", "-v"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let (d, rest) = split_dynamic(&args).unwrap_or_default();
        assert_eq!(d, vec!["a=1", "b=2"]);
        assert_eq!(rest, vec!["file.txt", "-v"]);
        assert!(split_dynamic(&["-D".to_string()]).is_err());
    }

    #[test]
    fn fingerprints_differ_by_name_and_version() {
        let a = Program {
            name: "a",
            version: "1",
        };
        let b = Program {
            name: "a",
            version: "2",
        };
        assert_ne!(a.fingerprint(), b.fingerprint());
        assert_eq!(a.fingerprint(), a.fingerprint());
    }
}
