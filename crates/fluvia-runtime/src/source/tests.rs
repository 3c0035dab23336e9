//! The source coordinator's split protocol.

#![allow(clippy::unwrap_used)]

use super::file::{FileSplit, FileSplitEnumerator, FileSplitReader, create_splits};
use super::*;
use std::io::Write;
use std::path::PathBuf;

fn splits(n: u64) -> Vec<FileSplit> {
    (0..n)
        .map(|i| FileSplit {
            path: PathBuf::from("f"),
            start: i * 10,
            end: i * 10 + 10,
        })
        .collect()
}

/// Sends a request from `attempt` of `subtask`; returns what each attempt
/// is sent, decoded.
fn request(
    c: &mut SourceCoordinator<FileSplitEnumerator>,
    subtask: usize,
    attempt: u32,
) -> Vec<(usize, u32, SourceEvent)> {
    let mut out = Outbox::default();
    c.handle_event(
        subtask,
        attempt,
        &SourceEvent::RequestSplit.encode(),
        &mut out,
    )
    .unwrap();
    decoded(out)
}

fn decoded(mut out: Outbox) -> Vec<(usize, u32, SourceEvent)> {
    out.take()
        .into_iter()
        .map(|e| (e.subtask, e.attempt, SourceEvent::decode(&e.event).unwrap()))
        .collect()
}

fn starts(event: &SourceEvent) -> Vec<u64> {
    match event {
        SourceEvent::AddSplits(s) => s
            .iter()
            .map(|b| FileSplit::decode(b).unwrap().start)
            .collect(),
        other => panic!("not splits: {other:?}"),
    }
}

#[test]
fn splits_go_to_the_readers_that_ask_so_a_fast_reader_takes_more() {
    let mut c = SourceCoordinator::new(FileSplitEnumerator::new(splits(4)), 2);
    let mut out = Outbox::default();
    c.attempt_ready(0, 0, &mut out).unwrap();
    c.attempt_ready(1, 0, &mut out).unwrap();
    assert!(out.is_empty(), "nothing is pushed before a reader asks");
    // Subtask 1 is fast: it asks three times before subtask 0 asks once.
    for expected in [0, 10, 20] {
        let sent = request(&mut c, 1, 0);
        assert_eq!(sent.len(), 1);
        assert_eq!((sent[0].0, sent[0].1), (1, 0));
        assert_eq!(starts(&sent[0].2), vec![expected]);
    }
    assert_eq!(starts(&request(&mut c, 0, 0)[0].2), vec![30]);
    assert_eq!(request(&mut c, 0, 0)[0].2, SourceEvent::NoMoreSplits);
    assert_eq!(request(&mut c, 1, 0)[0].2, SourceEvent::NoMoreSplits);
}

#[test]
fn a_speculative_attempt_gets_its_subtasks_splits_and_every_attempt_the_next_ones() {
    let mut c = SourceCoordinator::new(FileSplitEnumerator::new(splits(3)), 1);
    let mut out = Outbox::default();
    c.attempt_ready(0, 0, &mut out).unwrap();
    request(&mut c, 0, 0);
    // A second attempt of the same subtask starts: it is sent what the
    // first was given.
    let mut out = Outbox::default();
    c.attempt_ready(0, 1, &mut out).unwrap();
    let replay = decoded(out);
    assert_eq!(replay.len(), 1);
    assert_eq!((replay[0].1, starts(&replay[0].2)), (1, vec![0]));
    // Whichever asks, both get the next split.
    let sent = request(&mut c, 0, 1);
    assert_eq!(
        sent.iter()
            .map(|(_, a, e)| (*a, starts(e)))
            .collect::<Vec<_>>(),
        vec![(0, vec![10]), (1, vec![10])]
    );
    // The loser is cancelled: the winner alone hears of the rest.
    c.attempt_failed(0, 0, &mut Outbox::default()).unwrap();
    let sent = request(&mut c, 0, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!(c.assigned(0).len(), 3);
}

#[test]
fn a_failed_readers_splits_come_back_for_the_next_reader_that_asks() {
    let mut c = SourceCoordinator::new(FileSplitEnumerator::new(splits(3)), 2);
    request(&mut c, 0, 0);
    request(&mut c, 0, 0);
    assert_eq!(c.enumerator().remaining(), 1);
    // Subtask 0 fails and starts over: its two splits return, in order.
    c.attempt_failed(0, 0, &mut Outbox::default()).unwrap();
    c.subtask_reset(0, &mut Outbox::default()).unwrap();
    assert_eq!(c.enumerator().remaining(), 3);
    assert!(c.assigned(0).is_empty());
    assert_eq!(starts(&request(&mut c, 1, 0)[0].2), vec![0]);
    let mut out = Outbox::default();
    c.attempt_ready(0, 1, &mut out).unwrap();
    assert!(out.is_empty(), "the new attempt is sent nothing of the old");
    assert_eq!(starts(&request(&mut c, 0, 1)[0].2), vec![10]);
    // A reader that does not exist is an error, not a silent no-op.
    let mut out = Outbox::default();
    let err = c
        .handle_event(5, 0, &SourceEvent::RequestSplit.encode(), &mut out)
        .unwrap_err();
    assert!(err.to_string().contains("subtask 5"), "{err}");
}

#[test]
fn file_splits_cover_every_line_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.txt");
    let mut f = std::fs::File::create(&path).unwrap();
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
    let mut got = Vec::new();
    for s in splits {
        let mut r = FileSplitReader::open(s).unwrap();
        while let Some(line) = r.next_line().unwrap() {
            got.push(line.to_string());
        }
    }
    assert_eq!(got, expected);
}

#[test]
fn a_restarted_readers_first_request_gets_its_subtasks_splits_back() {
    let mut c = SourceCoordinator::new(FileSplitEnumerator::new(splits(3)), 1);
    request(&mut c, 0, 0);
    request(&mut c, 0, 0);
    c.attempt_failed(0, 0, &mut Outbox::default()).unwrap();
    let sent = request(&mut c, 0, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].1, starts(&sent[0].2)), (1, vec![0, 10]));
    assert_eq!(starts(&request(&mut c, 0, 1)[0].2), vec![20]);
    assert_eq!(request(&mut c, 0, 1)[0].2, SourceEvent::NoMoreSplits);
}

/// A checkpoint records the splits not handed out; a reset to it hands out
/// exactly those again (what readers held is in their own state) and
/// forgets which reader had what, so nothing is given twice.
#[test]
fn a_reset_to_a_checkpoint_hands_out_only_the_splits_not_assigned_then() {
    let mut c = SourceCoordinator::new(FileSplitEnumerator::new(splits(4)), 2);
    assert_eq!(starts(&request(&mut c, 0, 0)[0].2), vec![0]);
    let state = c.checkpoint(1).unwrap();
    // After the checkpoint more is handed out, then the job fails.
    assert_eq!(starts(&request(&mut c, 1, 0)[0].2), vec![10]);
    c.reset_to_checkpoint(1, &state).unwrap();
    // The restarted readers ask again: split 10 (assigned after the
    // checkpoint) comes back, split 0 (held at the checkpoint) does not.
    assert_eq!(starts(&request(&mut c, 1, 1)[0].2), vec![10]);
    assert_eq!(starts(&request(&mut c, 0, 1)[0].2), vec![20]);
    assert_eq!(starts(&request(&mut c, 0, 1)[0].2), vec![30]);
    assert!(matches!(
        request(&mut c, 1, 1)[0].2,
        SourceEvent::NoMoreSplits
    ));
    assert!(c.reset_to_checkpoint(1, b"not a state").is_err());
}

/// A reader's remainder resumes at the next unread line.
#[test]
fn a_split_remainder_resumes_at_the_next_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lines.txt");
    let mut f = std::fs::File::create(&path).unwrap();
    for i in 0..100 {
        writeln!(f, "line {i}").unwrap();
    }
    drop(f);
    let split = create_splits(std::slice::from_ref(&path), 1)
        .unwrap()
        .remove(0);
    let mut r = FileSplitReader::open(split).unwrap();
    for i in 0..37 {
        assert_eq!(r.next_line().unwrap(), Some(format!("line {i}").as_str()));
    }
    let rest = r.remainder().unwrap();
    let mut resumed = FileSplitReader::open(rest).unwrap();
    for i in 37..100 {
        assert_eq!(
            resumed.next_line().unwrap(),
            Some(format!("line {i}").as_str())
        );
    }
    assert_eq!(resumed.next_line().unwrap(), None);
    assert!(resumed.remainder().is_none());
}
