//! Application mode through separate processes: a stock `fluvia jobmanager`,
//! a `fluvia-quickstart taskmanager` (this program's own binary) and a stock
//! `fluvia taskmanager`. The quickstart job runs only on its own
//! TaskManager and answers as its embedded run does; a SQL query on the same
//! cluster runs on the stock one, and still does while the quickstart's
//! TaskManager is stopped mid-deployment (one stuck TaskManager delays only
//! its own calls).

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The stock `fluvia` binary beside this package's binary: `cargo test
/// --workspace` builds it for the CLI's own tests. Run alone (`cargo test -p
/// fluvia-quickstart`), the test builds it when it is missing; a nested
/// build of the whole CLI would otherwise recompile DataFusion with another
/// feature set, so an existing binary is used as it is.
fn fluvia_binary() -> PathBuf {
    let quickstart = PathBuf::from(env!("CARGO_BIN_EXE_fluvia-quickstart"));
    let fluvia = quickstart.with_file_name(format!("fluvia{}", std::env::consts::EXE_SUFFIX));
    if !fluvia.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let o = Command::new(cargo)
            .args(["build", "-p", "fluvia-cli", "--bin", "fluvia"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    fluvia
}

/// Kills the cluster's processes however the test ends.
struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn rest_get(addr: &str, path: &str) -> serde_json::Value {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let body = &resp[resp.find("\r\n\r\n").unwrap() + 4..];
    let json = &body[body.find('{').unwrap()..=body.rfind('}').unwrap()];
    serde_json::from_str(json).unwrap()
}

// A stopped TaskManager must not be declared lost during the test.
const FAST: [&str; 4] = [
    "-D",
    "heartbeat.interval=100",
    "-D",
    "heartbeat.timeout=60000",
];

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn the_quickstart_runs_on_its_own_task_manager_beside_a_stock_one() {
    let fluvia = fluvia_binary();
    let quickstart = env!("CARGO_BIN_EXE_fluvia-quickstart");
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("words.txt");
    let mut words = String::new();
    for i in 0..5_000 {
        words.push_str(&format!("alpha beta{} gamma{} delta\n", i % 7, i % 13));
    }
    std::fs::write(&text, words).unwrap();

    let embedded = Command::new(quickstart).arg(&text).output().unwrap();
    assert!(
        embedded.status.success(),
        "{}",
        String::from_utf8_lossy(&embedded.stderr)
    );

    let mut procs = Processes(Vec::new());
    let mut jm = Command::new(&fluvia)
        .args([
            "jobmanager",
            "-D",
            "jobmanager.rpc.port=0",
            "-D",
            "rest.port=0",
        ])
        .args(FAST)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(jm.stdout.take().unwrap());
    procs.0.push(jm);
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let rpc = line
        .trim()
        .strip_prefix("JobManager RPC ")
        .unwrap()
        .to_string();
    line.clear();
    out.read_line(&mut line).unwrap();
    let rest = line
        .trim()
        .strip_prefix("REST http://")
        .unwrap()
        .to_string();

    let task_manager = |binary: &std::ffi::OsStr| {
        Command::new(binary)
            .args(["taskmanager", "--jobmanager", &rpc, "--slots", "2"])
            .args(FAST)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let own = task_manager(quickstart.as_ref());
    let own_pid = own.id();
    procs.0.push(own);
    let stock = task_manager(fluvia.as_os_str());
    let stock_pid = stock.id();
    procs.0.push(stock);
    let deadline = Instant::now() + Duration::from_secs(20);
    while rest_get(&rest, "/overview")["taskmanagers"] != 2 {
        assert!(Instant::now() < deadline, "TaskManagers did not register");
        std::thread::sleep(Duration::from_millis(50));
    }
    // TaskManager ids end with their process id.
    let tm_of = |id: &serde_json::Value| -> u32 {
        id.as_str()
            .unwrap()
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };

    let remote = Command::new(quickstart)
        .args(["--jobmanager", &rpc])
        .arg(&text)
        .output()
        .unwrap();
    assert!(
        remote.status.success(),
        "{}",
        String::from_utf8_lossy(&remote.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&remote.stdout),
        String::from_utf8_lossy(&embedded.stdout)
    );
    let jobs = rest_get(&rest, "/jobs");
    let id = jobs["jobs"][0]["id"].as_str().unwrap().to_string();
    let job = rest_get(&rest, &format!("/jobs/{id}"));
    assert_eq!(job["state"], "FINISHED");
    let mut subtasks = 0;
    for v in job["vertices"].as_array().unwrap() {
        for s in v["subtasks"].as_array().unwrap() {
            assert_eq!(tm_of(&s["taskmanager-id"]), own_pid, "{s}");
            subtasks += 1;
        }
    }
    assert_eq!(subtasks, 4);

    // SQL on the same cluster runs on the stock TaskManager.
    let tables = dir.path().join("tables");
    std::fs::create_dir_all(tables.join("t")).unwrap();
    std::fs::write(tables.join("t/part.csv"), "k,v\na,1\nb,2\na,3\n").unwrap();
    let run_sql = || {
        let sql = Command::new(&fluvia)
            .args(["sql", "--jobmanager", &rpc, "--format", "csv", "-p", "2"])
            .arg("--tables")
            .arg(&tables)
            .args(["-e", "select k, sum(v) as s from t group by k order by k"])
            .output()
            .unwrap();
        assert!(
            sql.status.success(),
            "{}",
            String::from_utf8_lossy(&sql.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&sql.stdout), "k,s\na,4\nb,2\n");
    };
    run_sql();
    let job_at = |n: usize| {
        let jobs = rest_get(&rest, "/jobs");
        let id = jobs["jobs"][n]["id"].as_str().unwrap().to_string();
        rest_get(&rest, &format!("/jobs/{id}"))
    };
    for v in job_at(1)["vertices"].as_array().unwrap() {
        for s in v["subtasks"].as_array().unwrap() {
            assert_eq!(tm_of(&s["taskmanager-id"]), stock_pid, "{s}");
        }
    }

    // Stop the quickstart's TaskManager and submit to it: its deployment
    // hangs, and a SQL job still runs meanwhile.
    signal(own_pid, "-STOP");
    let client = Command::new(quickstart)
        .args(["--jobmanager", &rpc])
        .arg(&text)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let jobs = rest_get(&rest, "/jobs");
        if jobs["jobs"].as_array().unwrap().len() == 3
            && job_at(2)["vertices"][0]["subtasks"][0]["status"] == "DEPLOYING"
        {
            break;
        }
        assert!(Instant::now() < deadline, "the third job was not deploying");
        std::thread::sleep(Duration::from_millis(20));
    }
    run_sql();
    let stuck = job_at(2);
    assert_eq!(stuck["state"], "RUNNING", "{stuck}");
    signal(own_pid, "-CONT");
    let out = client.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, embedded.stdout);
}
