//! What the binary's test files share: the `fluvia` binary, TPC-DS data
//! and runs, and a cluster of separate processes.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub fn fluvia() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fluvia"))
}

pub fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tpcds")
}

/// SF 0.1 tables in `CARGO_TARGET_TMPDIR/<name>`, generated once per build
/// directory by `tpcds gen` with `args`.
fn generated_tables(name: &str, args: &[&std::ffi::OsStr]) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let done = dir.join(".complete");
    if !done.exists() {
        let o = fluvia()
            .args(["tpcds", "gen", "--scale", "0.1", "--out"])
            .arg(&dir)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::write(&done, "").unwrap();
    }
    dir
}

/// SF 0.1 Parquet tables, checked against the reference checksums.
pub fn tpcds_data() -> &'static Path {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        let check = shared().join("answers/sf0.1/tables.csv");
        generated_tables("tpcds-sf0.1", &["--check".as_ref(), check.as_os_str()])
    })
}

/// The same SF 0.1 tables as CSV (with their declared schemas; the
/// answers check them, `--check` reads Parquet only).
pub fn tpcds_csv_data() -> &'static Path {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| generated_tables("tpcds-sf0.1-csv", &["--format".as_ref(), "csv".as_ref()]))
}

pub fn tpcds_run(extra: &[&str]) -> (bool, String) {
    let o = fluvia()
        .args(["tpcds", "run", "--data"])
        .arg(tpcds_data())
        .arg("--queries")
        .arg(shared().join("queries"))
        .arg("--check")
        .arg(shared().join("answers/sf0.1"))
        .args(extra)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    println!("{out}");
    eprintln!("{}", String::from_utf8_lossy(&o.stderr));
    (o.status.success(), out)
}

/// Kills its processes when dropped, so a failing test leaves nothing behind.
pub struct Cluster {
    pub jm: Child,
    pub tms: Vec<Child>,
    pub shuffle_services: Vec<Child>,
    pub rpc: String,
    pub rest: String,
    tm_args: Vec<String>,
    heartbeats: Vec<String>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self
            .tms
            .iter_mut()
            .chain(self.shuffle_services.iter_mut())
            .chain(std::iter::once(&mut self.jm))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// Short enough to notice a killed TaskManager quickly (failures also trigger
// an immediate liveness probe), long enough that several clusters sharing two
// cores during a loaded test run do not miss heartbeats.
pub const FAST_HEARTBEATS: [&str; 4] = [
    "-D",
    "heartbeat.interval=100",
    "-D",
    "heartbeat.timeout=3000",
];

impl Cluster {
    pub fn start(jm_args: &[&str], task_managers: usize, tm_args: &[&str]) -> Cluster {
        Self::start_with_heartbeats(&FAST_HEARTBEATS, jm_args, task_managers, tm_args)
    }

    /// Like [`start`](Self::start) with other heartbeat settings (the
    /// defaults when empty): long jobs under load must not miss heartbeats.
    pub fn start_with_heartbeats(
        heartbeats: &[&str],
        jm_args: &[&str],
        task_managers: usize,
        tm_args: &[&str],
    ) -> Cluster {
        let mut jm = fluvia();
        jm.args([
            "jobmanager",
            "-D",
            "jobmanager.rpc.port=0",
            "-D",
            "rest.port=0",
        ])
        .args(heartbeats)
        .args(jm_args);
        let (jm, [rpc, rest]) = spawn_announcing(&mut jm, ["JobManager RPC ", "REST http://"]);
        let mut c = Cluster {
            jm,
            tms: Vec::new(),
            shuffle_services: Vec::new(),
            rpc,
            rest,
            tm_args: tm_args.iter().map(|s| s.to_string()).collect(),
            heartbeats: heartbeats.iter().map(|s| s.to_string()).collect(),
        };
        for _ in 0..task_managers {
            c.add_task_manager();
        }
        c.wait_for_task_managers(task_managers);
        c
    }

    pub fn add_task_manager(&mut self) {
        let tm = fluvia()
            .args(["taskmanager", "--jobmanager", &self.rpc])
            .args(&self.heartbeats)
            .args(&self.tm_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.tms.push(tm);
    }

    /// Starts `fluvia shuffle-service` on `dir` and waits until the
    /// JobManager knows it; returns its process id.
    /// `fluvia sql -p <parallelism>` running `script` on this cluster.
    pub fn sql(&self, parallelism: &str, script: &str) -> Output {
        fluvia()
            .args([
                "sql",
                "-p",
                parallelism,
                "--jobmanager",
                &self.rpc,
                "-e",
                script,
            ])
            .output()
            .unwrap()
    }

    pub fn add_shuffle_service(&mut self, dir: &Path) -> u32 {
        let mut cmd = fluvia();
        cmd.args(["shuffle-service", "--jobmanager", &self.rpc, "--dir"])
            .arg(dir)
            .args(&self.heartbeats);
        let (s, [id]) = spawn_announcing(&mut cmd, ["Shuffle service "]);
        let pid = s.id();
        self.shuffle_services.push(s);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let services = get(&self.rest, "/shuffle-services");
            if services["shuffle-services"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == id.as_str())
            {
                return pid;
            }
            assert!(
                Instant::now() < deadline,
                "shuffle service {id} did not register"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn wait_for_task_managers(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if get(&self.rest, "/overview")["taskmanagers"].as_u64() == Some(n as u64) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("{n} TaskManagers did not register");
    }

    pub fn run(&self, args: &[&str]) -> Output {
        fluvia()
            .args(["run", "--jobmanager", &self.rpc])
            .args(args)
            .output()
            .unwrap()
    }

    /// Runs the word count job from `input` into `output`, with `extra`
    /// arguments after them.
    pub fn wordcount(&self, input: &Path, output: &Path, extra: &[&str]) -> Output {
        let mut args = vec![
            "wordcount",
            "--input",
            input.to_str().unwrap(),
            "--output",
            output.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.run(&args)
    }
}

/// Starts `cmd` and reads the lines it announces itself with: one a prefix
/// in `prefixes`, returned without it.
fn spawn_announcing<const N: usize>(
    cmd: &mut Command,
    prefixes: [&str; N],
) -> (Child, [String; N]) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let values = prefixes.map(|prefix| {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        line.trim()
            .strip_prefix(prefix)
            .unwrap_or_else(|| panic!("{line}"))
            .to_string()
    });
    (child, values)
}

/// A tiny HTTP client: enough for the REST API's JSON.
/// [`http`] without extra headers.
pub fn request(addr: &str, method: &str, path: &str) -> (u16, String) {
    http(addr, method, path, &[])
}

pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("Content-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status: u16 = resp[9..12].parse().unwrap();
    let body = resp
        .split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default();
    // Chunked bodies: keep the JSON between the first '{' and the last '}'.
    let body = match (body.find(['{', '[']), body.rfind(['}', ']'])) {
        (Some(a), Some(b)) if b >= a && !path.ends_with("metrics") => body[a..=b].to_string(),
        _ => body,
    };
    (status, body)
}

/// A deterministic corpus of `lines` lines of 8 words: `hot_percent` of the
/// words are "hot", the others drawn from `distinct` words. Returns the
/// count of every word.
pub fn corpus(
    path: &Path,
    lines: usize,
    distinct: u64,
    hot_percent: u64,
) -> std::collections::BTreeMap<String, u64> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut text = String::with_capacity(lines * 48);
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..lines {
        for k in 0..8 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let word = if state % 100 < hot_percent {
                "hot".to_string()
            } else {
                format!("w{}", (state >> 8) % distinct)
            };
            if k > 0 {
                text.push(' ');
            }
            text.push_str(&word);
            *counts.entry(word).or_insert(0) += 1;
        }
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
    counts
}

/// The command succeeded; its error output otherwise.
#[track_caller]
pub fn assert_success(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The job id `fluvia run` printed ("Job <id> submitted ...").
pub fn job_id(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr);
    err.split_whitespace()
        .skip_while(|w| *w != "Job")
        .nth(1)
        .unwrap_or_else(|| panic!("no job id in: {err}"))
        .to_string()
}

pub fn get(addr: &str, path: &str) -> Value {
    let (status, body) = http(addr, "GET", path, &[]);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// Starts the `pipeline` example's endless count on `cluster` in `mode`
/// (on a thread) and waits until its source runs: the runner, the job's id
/// and its details then.
pub fn run_endless_pipeline(
    cluster: &Cluster,
    mode: &str,
) -> (std::thread::JoinHandle<Output>, String, Value) {
    let (rpc, mode) = (cluster.rpc.clone(), mode.to_string());
    let runner = std::thread::spawn(move || {
        fluvia()
            .args([
                "run",
                "--jobmanager",
                &rpc,
                "pipeline",
                "--rows",
                "1000000000000",
            ])
            .args(["--job", "count", "-p", "2", "--mode", &mode])
            .output()
            .unwrap()
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the job never ran");
        let jobs = get(&cluster.rest, "/jobs/overview");
        if let Some(j) = jobs["jobs"].as_array().and_then(|a| a.first())
            && j["state"] == "RUNNING"
        {
            let id = j["jid"].as_str().unwrap().to_string();
            let job = get(&cluster.rest, &format!("/jobs/{id}"));
            if job["vertices"][0]["status"] == "RUNNING" {
                return (runner, id, job);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
