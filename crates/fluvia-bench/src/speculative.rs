//! Speculative execution side by side in one run, on a cluster of separate
//! processes (the `fluvia` binary next to this one: build it with
//! `cargo build --release -p fluvia-cli` first): a batch word count on four
//! healthy TaskManagers; with one TaskManager slowed from outside (stopped
//! 75 % of the time by SIGSTOP / SIGCONT) and speculation off; and the same
//! with speculation on. Goal: with speculation on, within 1.5× of healthy.

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(ClapArgs)]
pub struct Args {
    /// Size of the generated corpus in MB.
    #[arg(long, default_value_t = 200)]
    mb: usize,
    /// `slow-task-detector.execution-time.baseline-lower-bound` (the
    /// default 1 min would never fire on a job of seconds).
    #[arg(long, default_value = "1s")]
    lower_bound: String,
}

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn binary() -> Result<PathBuf> {
    let me = std::env::current_exe()?;
    let bin = me.with_file_name("fluvia");
    if !bin.exists() {
        bail!(
            "{} not found: build it first (cargo build --release -p fluvia-cli)",
            bin.display()
        );
    }
    Ok(bin)
}

fn get(rest: &str, path: &str) -> Result<serde_json::Value> {
    let mut s = TcpStream::connect(rest)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {rest}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let body = resp.split_once("\r\n\r\n").map_or("", |x| x.1);
    let (a, b) = (body.find('{'), body.rfind('}'));
    match (a, b) {
        (Some(a), Some(b)) if b > a => Ok(serde_json::from_str(&body[a..=b])?),
        _ => bail!("GET {path}: no JSON in {resp}"),
    }
}

/// A JobManager and four one-slot TaskManagers; returns them with the RPC
/// and REST addresses.
fn cluster(bin: &Path) -> Result<(Processes, String, String)> {
    let mut jm = Command::new(bin)
        .args([
            "jobmanager",
            "-D",
            "jobmanager.rpc.port=0",
            "-D",
            "rest.port=0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut out = BufReader::new(jm.stdout.take().context("no stdout")?);
    let mut announced = |prefix: &str, what: &str| -> Result<String> {
        let mut line = String::new();
        out.read_line(&mut line)?;
        Ok(line
            .trim()
            .strip_prefix(prefix)
            .context(format!("no {what}"))?
            .to_string())
    };
    let rpc = announced("JobManager RPC ", "RPC address")?;
    let rest = announced("REST http://", "REST address")?;
    let mut procs = Processes(vec![jm]);
    for _ in 0..4 {
        procs.0.push(
            Command::new(bin)
                .args(["taskmanager", "--jobmanager", &rpc, "--slots", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while get(&rest, "/overview")?["taskmanagers"].as_u64() != Some(4) {
        if Instant::now() > deadline {
            bail!("the TaskManagers did not register");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok((procs, rpc, rest))
}

fn write_corpus(path: &Path, mb: usize) -> Result<()> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut text = String::with_capacity(mb << 20);
    while text.len() < mb << 20 {
        for k in 0..10 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            if k > 0 {
                text.push(' ');
            }
            text.push_str(&format!("w{}", state % 50_000));
        }
        text.push('\n');
    }
    std::fs::write(path, text)?;
    Ok(())
}

struct Outcome {
    secs: f64,
    effective: u64,
    output: Vec<u8>,
}

fn run_once(bin: &Path, input: &Path, slow: bool, speculative: bool, a: &Args) -> Result<Outcome> {
    let (procs, rpc, rest) = cluster(bin)?;
    let stop = Arc::new(AtomicBool::new(false));
    let slowing = slow.then(|| {
        let pid = procs.0[1].id().to_string();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = Command::new("kill").args(["-STOP", &pid]).status();
                std::thread::sleep(Duration::from_millis(150));
                let _ = Command::new("kill").args(["-CONT", &pid]).status();
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    });
    let out = input.with_extension(format!("{slow}-{speculative}.out"));
    let started = Instant::now();
    let o = Command::new(bin)
        .args(["run", "--jobmanager", &rpc, "wordcount", "--input"])
        .arg(input)
        .arg("--output")
        .arg(&out)
        .args(["-p", "4", "-D"])
        .arg(format!("execution.batch.speculative.enabled={speculative}"))
        .arg("-D")
        .arg(format!(
            "slow-task-detector.execution-time.baseline-lower-bound={}",
            a.lower_bound
        ))
        .args(["-D", "slow-task-detector.check-interval=200ms"])
        .output()?;
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = slowing {
        let _ = t.join();
    }
    if !o.status.success() {
        bail!("{}", String::from_utf8_lossy(&o.stderr));
    }
    let jobs = get(&rest, "/jobs")?;
    let id = jobs["jobs"][0]["id"]
        .as_str()
        .context("no job")?
        .to_string();
    let details = get(&rest, &format!("/jobs/{id}"))?;
    drop(procs);
    Ok(Outcome {
        secs,
        effective: details["numEffectiveSpeculativeExecutions"]
            .as_u64()
            .unwrap_or(0),
        output: std::fs::read(&out)?,
    })
}

pub fn run(a: Args) -> Result<()> {
    let bin = binary()?;
    let dir = tempfile::tempdir()?;
    let input = dir.path().join("corpus.txt");
    write_corpus(&input, a.mb)?;
    println!(
        "word count, {} MB, -p 4, 4 TaskManagers of 1 slot (separate processes), lower bound {}",
        a.mb, a.lower_bound
    );
    println!("| run | job (client wall time) | vs healthy | speculative attempts that won |");
    println!("|---|---|---|---|");
    let healthy = run_once(&bin, &input, false, false, &a)?;
    let mut outputs = vec![healthy.output.clone()];
    println!(
        "| healthy | {:.2} s | 1.00 | {} |",
        healthy.secs, healthy.effective
    );
    for (name, speculative) in [
        ("one slowed, speculation off", false),
        ("one slowed, speculation on", true),
    ] {
        let o = run_once(&bin, &input, true, speculative, &a)?;
        println!(
            "| {name} | {:.2} s | {:.2} | {} |",
            o.secs,
            o.secs / healthy.secs,
            o.effective
        );
        outputs.push(o.output);
    }
    if outputs.iter().any(|o| *o != outputs[0]) {
        bail!("the outputs differ between runs");
    }
    println!("same output in every run");
    Ok(())
}
