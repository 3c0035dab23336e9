//! What the binary's test files share: the `fluvia` binary and TPC-DS
//! data and runs.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn fluvia() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fluvia"))
}

pub fn shared() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tpcds")
}

/// SF 0.1 tables, generated once per build directory and checked against
/// the reference checksums.
pub fn tpcds_data() -> &'static Path {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tpcds-sf0.1");
        let done = dir.join(".complete");
        if !done.exists() {
            let o = fluvia()
                .args(["tpcds", "gen", "--scale", "0.1", "--out"])
                .arg(&dir)
                .arg("--check")
                .arg(shared().join("answers/sf0.1/tables.csv"))
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            std::fs::write(&done, "").unwrap();
        }
        dir
    })
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
