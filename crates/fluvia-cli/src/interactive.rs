//! The interactive SQL client (`fluvia sql` on a terminal, as Flink's
//! `sql-client.sh`): a prompt with line editing and history, statements of
//! several lines ended by `;`, results as aligned tables with their row
//! count and time, and Ctrl-C that cancels the running statement and keeps
//! the session.
//!
//! It only reads lines and prints; statements run in [`SqlSession`].

use crate::session::{Outcome, SqlSession};
use crate::sql::{Cancel, SqlError};
use anyhow::{Context, Result};
use fluvia_sql::session::statement;
use rustyline::error::ReadlineError;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

const PROMPT: &str = "Fluvia SQL> ";
const CONTINUATION: &str = "          > ";

const HELP: &str = "\
Statements end with ';' and may span lines.
  SELECT ... / WITH ...            run a query
  INSERT [OVERWRITE] INTO t SELECT ... write part files into a table's folder
  CREATE TABLE t (...) WITH ('connector' = 'filesystem', 'path' = '...', 'format' = 'csv')
  CREATE [TEMPORARY] VIEW v AS SELECT ...
  DROP TABLE t / DROP VIEW v, SHOW TABLES, SHOW VIEWS, DESCRIBE t
  SET / SET 'key' = 'value' / RESET / RESET 'key'
  EXPLAIN SELECT ...               the JobGraph
  HELP; QUIT; (or Ctrl-D)          Ctrl-C cancels the running statement";

/// Where the history is kept between sessions (Flink: `~/.flink-sql-history`).
fn history_file() -> Option<std::path::PathBuf> {
    if let Some(f) = std::env::var_os("FLUVIA_SQL_HISTORY") {
        return Some(f.into());
    }
    std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".fluvia-sql-history"))
}

/// Ctrl-C while a statement runs cancels it: SIGINT is caught for the
/// whole session (at the prompt the terminal is raw, so Ctrl-C reaches
/// the line editor as a key instead).
fn watch_interrupts(current: Arc<Mutex<Option<Cancel>>>) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the interrupt watcher")?;
    // Installing the handler before returning: a Ctrl-C right after
    // the first statement starts must not kill the process.
    let mut signals = rt
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        })
        .context("catching Ctrl-C")?;
    std::thread::Builder::new()
        .name("ctrl-c".into())
        .spawn(move || {
            rt.block_on(async move {
                while signals.recv().await.is_some() {
                    let running = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if let Some(c) = running {
                        c.cancel();
                    }
                }
            })
        })
        .context("starting the interrupt watcher")?;
    Ok(())
}

/// Runs the client until QUIT or end of input.
pub fn run(session: &mut SqlSession) -> Result<ExitCode> {
    let mut editor = rustyline::DefaultEditor::new().context("opening the terminal")?;
    let history = history_file();
    if let Some(h) = &history {
        let _ = editor.load_history(h);
    }
    let current: Arc<Mutex<Option<Cancel>>> = Arc::default();
    watch_interrupts(Arc::clone(&current))?;
    println!("Fluvia SQL client: statements end with ';'. HELP; lists them, QUIT; leaves.");
    let mut buffer = String::new();
    'session: loop {
        let prompt = if buffer.is_empty() {
            PROMPT
        } else {
            CONTINUATION
        };
        match editor.readline(prompt) {
            Ok(line) => {
                if buffer.is_empty() && statement::is_blank(&line) {
                    continue;
                }
                buffer.push_str(&line);
                buffer.push('\n');
                let word = buffer
                    .trim()
                    .trim_end_matches(';')
                    .trim()
                    .to_ascii_uppercase();
                let bare = matches!(word.as_str(), "QUIT" | "EXIT" | "HELP");
                if !bare && !statement::is_complete(&buffer) {
                    continue;
                }
                let _ = editor.add_history_entry(buffer.trim());
                let text = std::mem::take(&mut buffer);
                for sql in statement::split_statements(&text) {
                    match sql.to_ascii_uppercase().as_str() {
                        "QUIT" | "EXIT" => break 'session,
                        "HELP" => {
                            println!("{HELP}");
                            continue;
                        }
                        _ => {}
                    }
                    let cancel = Cancel::default();
                    *current.lock().unwrap_or_else(|e| e.into_inner()) = Some(cancel.clone());
                    let outcome = session.execute(&sql, &cancel);
                    *current.lock().unwrap_or_else(|e| e.into_inner()) = None;
                    print_outcome(outcome);
                }
            }
            // Ctrl-C at the prompt drops what was typed.
            Err(ReadlineError::Interrupted) => buffer.clear(),
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e).context("reading from the terminal"),
        }
    }
    if let Some(h) = &history {
        let _ = editor.save_history(h);
    }
    println!("Goodbye.");
    Ok(ExitCode::SUCCESS)
}

fn print_outcome(outcome: Result<Outcome, SqlError>) {
    match outcome {
        Ok(Outcome::Message(m)) => println!("[INFO] {m}"),
        Ok(Outcome::Plan(p)) => print!("{p}"),
        Ok(Outcome::Rows(run)) => {
            let rows: usize = run.batches.iter().map(|b| b.num_rows()).sum();
            match fluvia_sql::datafusion::arrow::util::pretty::pretty_format_batches_with_schema(
                run.schema.clone(),
                &run.batches,
            ) {
                Ok(table) => println!("{table}"),
                Err(e) => println!("[ERROR] printing the result: {e}"),
            }
            if run.graph.is_some() {
                println!(
                    "{rows} row{} in {:.3} s",
                    if rows == 1 { "" } else { "s" },
                    run.elapsed.as_secs_f64()
                );
            } else {
                println!("{rows} row{}", if rows == 1 { "" } else { "s" });
            }
        }
        Err(SqlError::Query(msg)) => println!("[ERROR] {msg}"),
        Err(SqlError::Other(e)) => {
            let msg = format!("{e:#}");
            if msg.contains("CANCELED") {
                println!("[INFO] statement cancelled");
            } else {
                println!("[ERROR] {msg}");
            }
        }
    }
}
