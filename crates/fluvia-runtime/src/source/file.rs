//! The file source's splits: byte ranges of files, each owning the lines
//! that start inside it; the [`FileSplitEnumerator`] that hands them out
//! in order; and [`FileSplitReader`], which reads one split's lines.

use super::{SourceCoordinator, SplitEnumerator};
use crate::coordinator::OperatorCoordinator;
use fluvia_core::{FluviaError, Result};
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;

/// The coordinator kind of the file source.
pub const FILE_SOURCE_COORDINATOR: &str = "file-source";

/// A byte range of one file; it owns the lines that *start* inside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSplit {
    pub path: PathBuf,
    pub start: u64,
    pub end: u64,
}

wire_codec!(FileSplit, "file split");

/// What the file source's coordinator is built from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSourceConfig {
    pub paths: Vec<PathBuf>,
}

impl FileSourceConfig {
    pub fn encode(&self) -> Vec<u8> {
        bincode::serialize(self).unwrap_or_default()
    }
}

/// Splits files into ranges: at least one per reader overall, none smaller
/// than 1 MiB unless the file is, none larger than 64 MiB.
pub fn create_splits(paths: &[PathBuf], parallelism: usize) -> Result<Vec<FileSplit>> {
    let mut sizes = Vec::with_capacity(paths.len());
    for p in paths {
        let meta = std::fs::metadata(p)
            .map_err(|e| FluviaError::io(format!("input file '{}'", p.display()), e))?;
        sizes.push(meta.len());
    }
    let total: u64 = sizes.iter().sum();
    let split_size = (total / parallelism.max(1) as u64).clamp(1 << 20, 64 << 20);
    let mut splits = Vec::new();
    for (p, &size) in paths.iter().zip(&sizes) {
        let mut start = 0;
        loop {
            let end = (start + split_size).min(size);
            splits.push(FileSplit {
                path: p.clone(),
                start,
                end,
            });
            if end >= size {
                break;
            }
            start = end;
        }
    }
    Ok(splits)
}

/// Hands out file splits in order to whichever reader asks; splits given
/// back (their reader starts over) go first.
#[derive(Debug)]
pub struct FileSplitEnumerator {
    remaining: VecDeque<Vec<u8>>,
}

impl FileSplitEnumerator {
    pub fn new(splits: Vec<FileSplit>) -> Self {
        FileSplitEnumerator {
            remaining: splits.iter().map(FileSplit::encode).collect(),
        }
    }

    pub fn remaining(&self) -> usize {
        self.remaining.len()
    }
}

impl SplitEnumerator for FileSplitEnumerator {
    fn next_split(&mut self, _subtask: usize) -> Option<Vec<u8>> {
        self.remaining.pop_front()
    }

    fn add_splits_back(&mut self, splits: Vec<Vec<u8>>, _subtask: usize) {
        for s in splits.into_iter().rev() {
            self.remaining.push_front(s);
        }
    }

    fn snapshot(&self) -> Vec<Vec<u8>> {
        self.remaining.iter().cloned().collect()
    }

    fn restore(&mut self, splits: Vec<Vec<u8>>) {
        self.remaining = splits.into();
    }
}

/// The file source's coordinator, built on the JobManager from its config.
pub fn file_source_coordinator(
    config: &[u8],
    parallelism: usize,
) -> Result<Box<dyn OperatorCoordinator>> {
    let config: FileSourceConfig = bincode::deserialize(config)
        .map_err(|e| FluviaError::Plan(format!("malformed file source config: {e}")))?;
    let splits = create_splits(&config.paths, parallelism)?;
    Ok(Box::new(SourceCoordinator::new(
        FileSplitEnumerator::new(splits),
        parallelism,
    )))
}

/// Reads the lines of one split.
pub struct FileSplitReader {
    split: FileSplit,
    reader: BufReader<File>,
    pos: u64,
    line: Vec<u8>,
}

impl FileSplitReader {
    pub fn open(split: FileSplit) -> Result<Self> {
        let file = File::open(&split.path)
            .map_err(|e| FluviaError::io(format!("opening '{}'", split.path.display()), e))?;
        let mut reader = BufReader::with_capacity(256 * 1024, file);
        let mut pos = split.start;
        if split.start > 0 {
            // Skip the tail of a line that started in the previous split.
            reader.seek(SeekFrom::Start(split.start - 1)).map_err(|e| {
                FluviaError::io(format!("seeking in '{}'", split.path.display()), e)
            })?;
            let mut skipped = Vec::new();
            let n = reader
                .read_until(b'\n', &mut skipped)
                .map_err(|e| FluviaError::io(format!("reading '{}'", split.path.display()), e))?;
            pos = split.start - 1 + n as u64;
        }
        Ok(FileSplitReader {
            split,
            reader,
            pos,
            line: Vec::with_capacity(256),
        })
    }

    /// What of the split is not read yet: the lines that start at or after
    /// the read position (a checkpoint records it; reopening it resumes
    /// at the next line). `None` when nothing is left.
    pub fn remainder(&self) -> Option<FileSplit> {
        (self.pos < self.split.end).then(|| FileSplit {
            path: self.split.path.clone(),
            start: self.pos,
            end: self.split.end,
        })
    }

    /// The next line of the split (without its line end), or `None` at the
    /// split's end. A line that is not UTF-8 is an error naming the file
    /// and the line's byte offset.
    pub fn next_line(&mut self) -> Result<Option<&str>> {
        if self.pos >= self.split.end {
            return Ok(None);
        }
        self.line.clear();
        let line_start = self.pos;
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .map_err(|e| FluviaError::io(format!("reading '{}'", self.split.path.display()), e))?;
        if n == 0 {
            return Ok(None);
        }
        self.pos += n as u64;
        let mut bytes = &self.line[..];
        if let Some(b) = bytes.strip_suffix(b"\n") {
            bytes = b;
        }
        if let Some(b) = bytes.strip_suffix(b"\r") {
            bytes = b;
        }
        std::str::from_utf8(bytes).map(Some).map_err(|e| {
            FluviaError::Execution(format!(
                "'{}': the line at byte offset {line_start} is not valid UTF-8 ({e})",
                self.split.path.display()
            ))
        })
    }
}
