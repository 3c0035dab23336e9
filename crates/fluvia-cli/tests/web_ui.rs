//! The Web UI in a real browser: headless Chromium loads the JobManager's
//! pages of a running batch job on a cluster of separate processes, and the
//! tests read what it rendered from the DOM.
//!
//! Chromium is Debian's `chromium` package; `.ci/run` installs it and sets
//! `FLUVIA_REQUIRE_BROWSER=1`, so CI fails without it. Elsewhere, without a
//! browser on the machine, the tests say so and pass without checking.
//! `FLUVIA_UPDATE_SCREENSHOTS=1` writes the screenshots into `docs/`.

#![allow(clippy::unwrap_used)]

mod common;

use common::{Cluster, assert_success, fluvia, get, request, shared, tpcds_data};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn chromium() -> Option<PathBuf> {
    for c in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(o) = Command::new("which").arg(c).output()
            && o.status.success()
        {
            return Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
        }
    }
    if std::env::var_os("FLUVIA_REQUIRE_BROWSER").is_some() {
        panic!("FLUVIA_REQUIRE_BROWSER is set but no chromium is installed");
    }
    eprintln!("no chromium on this machine: the browser test checks nothing here");
    None
}

/// Chromium as a user on a machine with no internet would start it.
fn browser(bin: &Path, profile: &Path) -> Command {
    let mut c = Command::new(bin);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=8000",
        "--window-size=1400,1000",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The DOM of `url` once the page's fetches are done and `loaded` is
/// the route it says it rendered.
fn dom(bin: &Path, url: &str, loaded: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let o = browser(bin, profile.path())
            .arg("--dump-dom")
            .arg(url)
            .output()
            .unwrap();
        let html = String::from_utf8_lossy(&o.stdout).to_string();
        if html.contains(&format!("data-loaded=\"{loaded}\"")) {
            return html;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never rendered '{loaded}': {html}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn screenshot(bin: &Path, url: &str, name: &str) {
    let profile = tempfile::tempdir().unwrap();
    let dir = if std::env::var_os("FLUVIA_UPDATE_SCREENSHOTS").is_some() {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    };
    let path = dir.join(name);
    let o = browser(bin, profile.path())
        .arg(format!("--screenshot={}", path.display()))
        .arg(url)
        .output()
        .unwrap();
    assert!(
        path.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The elements of `html` whose opening tag has `class="<class>"`, as
/// their opening tags.
fn tags<'a>(html: &'a str, class: &str) -> Vec<&'a str> {
    let needle = format!("class=\"{class}\"");
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(at) = rest.find(&needle) {
        let start = rest[..at].rfind('<').unwrap_or(0);
        let end = at + rest[at..].find('>').unwrap_or(0);
        out.push(&rest[start..=end]);
        rest = &rest[end..];
    }
    out
}

fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let at = tag.find(&key)? + key.len();
    let len = tag[at..].find('"')?;
    Some(&tag[at..at + len])
}

/// The text of the `<g class="vertex" data-vertex-id="id">` element.
fn vertex_text(html: &str, id: &str) -> String {
    let key = format!("data-vertex-id=\"{id}\"");
    let at = html.find(&key).unwrap();
    let end = at + html[at..].find("</g>").unwrap();
    let mut text = String::new();
    let mut inside = false;
    for c in html[at..end].chars() {
        match c {
            '<' => {
                inside = true;
                text.push(' ');
            }
            '>' => inside = false,
            c if !inside => text.push(c),
            _ => {}
        }
    }
    text.replace("&gt;", ">")
        .replace("&lt;", "<")
        .replace("&amp;", "&")
}

#[test]
fn the_job_page_of_a_running_batch_job_shows_its_dag_and_every_attempt() {
    let Some(bin) = chromium() else {
        return;
    };
    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    // A batch job long enough to be looked at while it runs.
    let (runner, id, job) = common::run_endless_pipeline(&cluster, "batch");
    let base = format!("http://{}", cluster.rest);

    // The job list.
    let html = dom(&bin, &format!("{base}/#/"), "jobs");
    let rows = tags(&html, "job");
    assert!(
        rows.iter().any(|r| attr(r, "data-jid") == Some(id.as_str())
            && attr(r, "data-state") == Some("RUNNING")),
        "{rows:?}"
    );

    // The DAG: every vertex with its parallelism, every edge with its ship
    // strategy.
    let html = dom(&bin, &format!("{base}/#/jobs/{id}"), "job");
    let vertices = job["vertices"].as_array().unwrap();
    let drawn = tags(&html, "vertex");
    assert_eq!(drawn.len(), vertices.len(), "{drawn:?}");
    for v in vertices {
        let vid = v["id"].as_str().unwrap();
        let tag = drawn
            .iter()
            .find(|t| attr(t, "data-vertex-id") == Some(vid))
            .unwrap_or_else(|| panic!("vertex {vid} not drawn: {drawn:?}"));
        assert_eq!(
            attr(tag, "data-parallelism"),
            Some(v["parallelism"].to_string().as_str()),
            "{tag}"
        );
        let text = vertex_text(&html, vid);
        assert!(
            text.contains(&format!("Parallelism: {}", v["parallelism"])),
            "{text}"
        );
        for member in v["name"].as_str().unwrap().split(" -> ") {
            assert!(text.contains(member), "{member} not in {text}");
        }
    }
    assert_eq!(
        attr(drawn[0], "data-status"),
        Some("RUNNING"),
        "the running source is shown running: {drawn:?}"
    );
    let edges = tags(&html, "edge");
    let nodes = job["plan"]["nodes"].as_array().unwrap();
    let expected: Vec<(String, String, String)> = nodes
        .iter()
        .flat_map(|n| {
            n["inputs"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|i| {
                    (
                        i["id"].as_str().unwrap().to_string(),
                        n["id"].as_str().unwrap().to_string(),
                        i["ship_strategy"].as_str().unwrap().to_string(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(edges.len(), expected.len(), "{edges:?}");
    for (from, to, ship) in &expected {
        assert!(
            edges.iter().any(|e| attr(e, "data-source") == Some(from)
                && attr(e, "data-target") == Some(to)
                && attr(e, "data-ship-strategy") == Some(ship)),
            "edge {from} -> {to} ({ship}) not drawn: {edges:?}"
        );
    }
    screenshot(&bin, &format!("{base}/#/jobs/{id}"), "ui-job.png");

    // A vertex's subtasks list their attempts, with host and state.
    let source = vertices[0]["id"].as_str().unwrap();
    let html = dom(
        &bin,
        &format!("{base}/#/jobs/{id}/vertices/{source}"),
        "vertex",
    );
    assert!(
        html.contains(&format!("id=\"vertex-panel\" data-vertex-id=\"{source}\""))
            || html.contains(&format!("data-vertex-id=\"{source}\" id=\"vertex-panel\"")),
        "no vertex panel"
    );
    let attempts = tags(&html, "attempt");
    let details = get(&cluster.rest, &format!("/jobs/{id}/vertices/{source}"));
    let subtasks = details["subtasks"].as_array().unwrap();
    let total: usize = subtasks
        .iter()
        .map(|s| s["attempts"].as_array().unwrap().len())
        .sum();
    assert_eq!(attempts.len(), total, "{attempts:?}");
    for s in subtasks {
        for a in s["attempts"].as_array().unwrap() {
            let row = attempts
                .iter()
                .find(|r| {
                    attr(r, "data-subtask") == Some(s["subtask"].to_string().as_str())
                        && attr(r, "data-attempt") == Some(a["attempt"].to_string().as_str())
                })
                .unwrap_or_else(|| panic!("attempt {a} not listed: {attempts:?}"));
            assert_eq!(attr(row, "data-status"), Some("RUNNING"), "{row}");
            assert_eq!(attr(row, "data-host"), a["host"].as_str(), "{row}");
        }
    }

    // TaskManagers: both, with their blocked flag.
    let html = dom(&bin, &format!("{base}/#/taskmanagers"), "taskmanagers");
    let tms = tags(&html, "taskmanager");
    assert_eq!(tms.len(), 2, "{tms:?}");
    for t in &tms {
        assert_eq!(attr(t, "data-blocked"), Some("false"), "{t}");
    }
    screenshot(
        &bin,
        &format!("{base}/#/taskmanagers"),
        "ui-taskmanagers.png",
    );

    let (status, _) = request(&cluster.rest, "GET", &format!("/jobs/{id}/yarn-cancel"));
    assert_eq!(status, 202);
    let _ = runner.join().unwrap();
}

#[test]
fn a_tpcds_q96_job_page_shows_its_multiple_input_vertex_and_broadcast_edges() {
    let Some(bin) = chromium() else {
        return;
    };
    let cluster = Cluster::start(&[], 2, &["--slots", "2"]);
    let o = fluvia()
        .args(["sql", "--tables"])
        .arg(tpcds_data())
        .arg("-f")
        .arg(shared().join("queries/q96.sql"))
        .args(["-p", "2", "--jobmanager", &cluster.rpc])
        // On DataFusion's byte ranges: each SF 0.1 table is one row group,
        // and split on row groups q96 would be one task without edges.
        .args(["-D", "table.exec.parquet.split-on-row-groups=false"])
        // And its dimension tables broadcast by tasks of their own, as at
        // larger scales (each is under the size read in the join's task).
        .args(["-D", "table.optimizer.small-build-side-in-task.max-size=0"])
        .output()
        .unwrap();
    assert_success(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    let url = err
        .split_whitespace()
        .find(|w| w.starts_with("http://") && w.contains("/#/jobs/"))
        .unwrap_or_else(|| panic!("no Web UI address printed: {err}"))
        .to_string();
    let id = url.rsplit('/').next().unwrap().to_string();
    let job: Value = get(&cluster.rest, &format!("/jobs/{id}"));
    let html = dom(&bin, &url, "job");
    let nodes = job["plan"]["nodes"].as_array().unwrap();
    let fused = nodes
        .iter()
        .find(|n| !n["multiple-input"].is_null())
        .expect("q96 plans a multiple-input task");
    let text = vertex_text(&html, fused["id"].as_str().unwrap());
    assert!(text.contains("MultipleInput"), "{text}");
    for m in fused["multiple-input"]["members"].as_array().unwrap() {
        assert!(text.contains(m.as_str().unwrap()), "{m} not in {text}");
    }
    let broadcast: Vec<&str> = tags(&html, "edge")
        .into_iter()
        .filter(|e| attr(e, "data-ship-strategy") == Some("BROADCAST"))
        .collect();
    assert!(broadcast.len() >= 2, "{broadcast:?}");
    for e in &broadcast {
        assert_eq!(attr(e, "data-target"), fused["id"].as_str(), "{e}");
    }
    screenshot(&bin, &url, "ui-q96.png");
}
