//! Built-in bounded sources: a collection, a generator (and number
//! sequence), and text files read as lines.
//!
//! Every source splits its work deterministically by subtask index, so the
//! same job reads the same data whatever process a subtask runs in.

use fluvia_core::{FluviaError, Result};
use fluvia_runtime::{Collector, Data, SourceOperator, SourceStatus, UserError};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

/// Records emitted per poll: large enough to amortise the poll, small enough
/// to notice cancellation quickly.
const BATCH: usize = 1024;

pub struct CollectionSource<T> {
    items: Arc<Vec<T>>,
    next: usize,
    step: usize,
}

impl<T> CollectionSource<T> {
    pub fn new(items: Arc<Vec<T>>, subtask: usize, parallelism: usize) -> Self {
        CollectionSource {
            items,
            next: subtask,
            step: parallelism.max(1),
        }
    }
}

impl<T: Data> SourceOperator<T> for CollectionSource<T> {
    fn poll_next(&mut self, out: &mut Collector<'_, T>) -> Result<SourceStatus, UserError> {
        for _ in 0..BATCH {
            let Some(item) = self.items.get(self.next) else {
                return Ok(SourceStatus::End);
            };
            out.collect(item.clone());
            self.next += self.step;
        }
        Ok(SourceStatus::MoreAvailable)
    }
}

pub struct GeneratorSource<T> {
    f: Arc<dyn Fn(u64) -> T + Send + Sync>,
    next: u64,
    end: u64,
}

impl<T> GeneratorSource<T> {
    pub fn new(
        f: Arc<dyn Fn(u64) -> T + Send + Sync>,
        count: u64,
        subtask: usize,
        parallelism: usize,
    ) -> Self {
        let p = parallelism.max(1) as u128;
        let share = |i: u128| (i * count as u128 / p) as u64;
        GeneratorSource {
            f,
            next: share(subtask as u128),
            end: share(subtask as u128 + 1),
        }
    }
}

impl<T: Data> SourceOperator<T> for GeneratorSource<T> {
    fn poll_next(&mut self, out: &mut Collector<'_, T>) -> Result<SourceStatus, UserError> {
        let stop = self.end.min(self.next + BATCH as u64);
        while self.next < stop {
            out.collect((self.f)(self.next));
            self.next += 1;
        }
        Ok(if self.next >= self.end {
            SourceStatus::End
        } else {
            SourceStatus::MoreAvailable
        })
    }
}

/// A byte range of one file; it owns the lines that *start* inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSplit {
    pub path: PathBuf,
    pub start: u64,
    pub end: u64,
}

/// Splits files into ranges: at least one per reader overall, none smaller
/// than 1 MiB unless the file is.
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

/// Reads lines of the splits `i, i+p, i+2p, ...` for subtask `i`.
pub struct TextFileSource {
    paths: Arc<Vec<PathBuf>>,
    subtask: usize,
    parallelism: usize,
    splits: Vec<FileSplit>,
    current: Option<SplitReader>,
}

struct SplitReader {
    split: FileSplit,
    reader: BufReader<File>,
    pos: u64,
    line: Vec<u8>,
}

impl TextFileSource {
    pub fn new(paths: Arc<Vec<PathBuf>>, subtask: usize, parallelism: usize) -> Self {
        TextFileSource {
            paths,
            subtask,
            parallelism,
            splits: Vec::new(),
            current: None,
        }
    }

    /// Fails (before the job runs) if an input is missing or not a file.
    pub fn validate(paths: &[PathBuf]) -> Result<()> {
        for p in paths {
            match std::fs::metadata(p) {
                Ok(m) if m.is_file() => {}
                Ok(_) => {
                    return Err(FluviaError::Plan(format!(
                        "input '{}' is not a regular file",
                        p.display()
                    )));
                }
                Err(e) => {
                    return Err(FluviaError::Plan(format!(
                        "input file '{}' cannot be read: {e}",
                        p.display()
                    )));
                }
            }
        }
        Ok(())
    }

    fn open_split(split: FileSplit) -> Result<SplitReader> {
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
        Ok(SplitReader {
            split,
            reader,
            pos,
            line: Vec::with_capacity(256),
        })
    }
}

impl SourceOperator<String> for TextFileSource {
    fn open(&mut self, _ctx: &fluvia_runtime::OperatorContext) -> Result<(), UserError> {
        self.splits = create_splits(&self.paths, self.parallelism)?
            .into_iter()
            .enumerate()
            .filter(|(i, _)| i % self.parallelism == self.subtask)
            .map(|(_, s)| s)
            .collect();
        self.splits.reverse(); // popped from the back, in order
        Ok(())
    }

    fn poll_next(&mut self, out: &mut Collector<'_, String>) -> Result<SourceStatus, UserError> {
        let mut emitted = 0;
        while emitted < BATCH {
            let current = match &mut self.current {
                Some(c) => c,
                None => match self.splits.pop() {
                    Some(s) => self.current.insert(Self::open_split(s)?),
                    None => return Ok(SourceStatus::End),
                },
            };
            if current.pos >= current.split.end {
                self.current = None;
                continue;
            }
            current.line.clear();
            let line_start = current.pos;
            let n = current
                .reader
                .read_until(b'\n', &mut current.line)
                .map_err(|e| {
                    FluviaError::io(format!("reading '{}'", current.split.path.display()), e)
                })?;
            if n == 0 {
                self.current = None;
                continue;
            }
            current.pos += n as u64;
            let mut bytes = &current.line[..];
            if let Some(b) = bytes.strip_suffix(b"\n") {
                bytes = b;
            }
            if let Some(b) = bytes.strip_suffix(b"\r") {
                bytes = b;
            }
            let line = std::str::from_utf8(bytes).map_err(|e| {
                FluviaError::Execution(format!(
                    "'{}': the line at byte offset {line_start} is not valid UTF-8 ({e})",
                    current.split.path.display()
                ))
            })?;
            out.collect(line.to_string());
            emitted += 1;
        }
        Ok(SourceStatus::MoreAvailable)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// Reads every split of `paths` as `p` readers would, concatenating lines.
    fn read_all(paths: &[PathBuf], p: usize) -> Vec<String> {
        let mut lines = Vec::new();
        for split in create_splits(paths, p).unwrap() {
            let mut r = TextFileSource::open_split(split.clone()).unwrap();
            while r.pos < split.end {
                r.line.clear();
                let n = r.reader.read_until(b'\n', &mut r.line).unwrap();
                if n == 0 {
                    break;
                }
                r.pos += n as u64;
                lines.push(
                    String::from_utf8(r.line.clone())
                        .unwrap()
                        .trim_end_matches('\n')
                        .to_string(),
                );
            }
        }
        lines
    }

    #[test]
    fn splits_cover_every_line_exactly_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        let mut f = File::create(&path).unwrap();
        let mut expected = Vec::new();
        // ~3.5 MiB so that several 1 MiB splits cut lines in the middle.
        for i in 0..200_000 {
            let line = format!("line {i}:{}", "x".repeat(i % 13));
            writeln!(f, "{line}").unwrap();
            expected.push(line);
        }
        drop(f);
        let splits = create_splits(std::slice::from_ref(&path), 4).unwrap();
        assert!(splits.len() >= 3, "{splits:?}");
        let got = read_all(&[path], 4);
        assert_eq!(got.len(), expected.len());
        assert!(got == expected, "lines differ");
    }
}
