//! Cluster configuration: Flink's key names, from a file (flat YAML as in
//! `flink-conf.yaml`, or TOML) plus `-D key=value` overrides.

use fluvia_core::{Configuration, FluviaError, Result};
use std::path::Path;
use std::time::Duration;

fluvia_core::config_options! {
    SHUFFLE_SERVICE_TYPE: &'static str = "shuffle-service.type",
        "internal",
        "Where blocking partitions are served from: internal (the producing \
        TaskManager) or external (the `fluvia shuffle-service` of its host). Set on \
        the JobManager as the default, or per job.";
    SHUFFLE_SERVICE_HOST: &'static str = "shuffle-service.host",
        "127.0.0.1",
        "Address a shuffle service binds to; TaskManagers whose data address is on \
        this host hand their partitions to it.";
    SHUFFLE_SERVICE_DATA_PORT: usize = "shuffle-service.data.port",
        0,
        "Data port of a shuffle service (0 picks a free port).";
    SHUFFLE_SERVICE_RPC_PORT: usize = "shuffle-service.rpc.port",
        0,
        "RPC port of a shuffle service (0 picks a free port).";
    SHUFFLE_SERVICE_DIR: &'static str = "shuffle-service.dir",
        "",
        "Directory of a shuffle service's partition files (empty: \
        <io.tmp.dirs>/fluvia-shuffle-service).";
    JOBMANAGER_ADDRESS: &'static str = "jobmanager.rpc.address",
        "127.0.0.1",
        "Address the JobManager binds its RPC server to (loopback by default).";
    JOBMANAGER_PORT: usize = "jobmanager.rpc.port",
        6123,
        "RPC port of the JobManager (0 picks a free port).";
    REST_ADDRESS: &'static str = "rest.address" | "rest.bind-address",
        "127.0.0.1",
        "Address of the REST API.";
    REST_PORT: usize = "rest.port",
        8081,
        "Port of the REST API (0 picks a free port).";
    TASKMANAGER_HOST: &'static str = "taskmanager.host",
        "127.0.0.1",
        "Address a TaskManager binds its RPC and data servers to.";
    TASKMANAGER_RPC_PORT: usize = "taskmanager.rpc.port",
        0,
        "RPC port of a TaskManager (0 picks a free port).";
    TASKMANAGER_DATA_PORT: usize = "taskmanager.data.port",
        0,
        "Data port of a TaskManager (0 picks a free port).";
    SLOTS: usize = "taskmanager.numberOfTaskSlots",
        1,
        "Slots of a TaskManager.";
    HEARTBEAT_INTERVAL: Duration = "heartbeat.interval",
        Duration::from_secs(10),
        "How often a TaskManager reports to the JobManager.";
    HEARTBEAT_TIMEOUT: Duration = "heartbeat.timeout",
        Duration::from_secs(50),
        "Silence after which a TaskManager is declared lost.";
    METRICS_UPDATE_INTERVAL: Duration = "metrics.fetcher.update-interval",
        Duration::from_secs(1),
        "How old the live task metrics of the REST API and Web UI may be: while tasks \
        run, a TaskManager reports them this often (between heartbeats).";
    WEB_REFRESH_INTERVAL: Duration = "web.refresh-interval",
        Duration::from_secs(1),
        "How often the Web UI refreshes what it shows.";
    SLOT_REQUEST_TIMEOUT: Duration = "slot.request.timeout",
        Duration::from_secs(300),
        "How long a job waits for enough slots before it fails.";
    CLUSTER_SECRET: &'static str = "security.cluster-secret",
        "" => "(none)",
        "Shared secret every RPC, data connection and REST mutation must present.";
    CLUSTER_SECRET_FILE: &'static str = "security.cluster-secret.file",
        "" => "(none)",
        "File whose first line is the cluster secret.";
}

/// Loads `path` (TOML if it ends in `.toml`, else flat YAML) and applies
/// `-D` overrides on top.
pub fn load(path: Option<&Path>, dynamic: &[String]) -> Result<Configuration> {
    let mut c = match path {
        None => Configuration::new(),
        Some(p) if p.extension().is_some_and(|e| e == "toml") => load_toml(p)?,
        Some(p) => Configuration::load_file(p)?,
    };
    c.apply_dynamic(dynamic)?;
    Ok(c)
}

fn load_toml(path: &Path) -> Result<Configuration> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| FluviaError::Config(format!("cannot read '{}': {e}", path.display())))?;
    let table: toml::Table = text
        .parse()
        .map_err(|e| FluviaError::Config(format!("'{}': {e}", path.display())))?;
    let mut c = Configuration::new();
    fn walk(prefix: &str, t: &toml::Table, c: &mut Configuration) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(t) => walk(&key, t, c),
                toml::Value::String(s) => {
                    c.set(key, s.clone());
                }
                other => {
                    c.set(key, other.to_string());
                }
            }
        }
    }
    walk("", &table, &mut c);
    Ok(c)
}

/// The cluster secret from the configuration or its file; `None` if unset.
pub fn cluster_secret(c: &Configuration) -> Result<Option<String>> {
    let direct = c.get(&CLUSTER_SECRET)?;
    if !direct.is_empty() {
        return Ok(Some(direct.to_string()));
    }
    let file = c.get(&CLUSTER_SECRET_FILE)?;
    if file.is_empty() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(file).map_err(|e| {
        FluviaError::Config(format!(
            "cannot read {} '{file}': {e}",
            CLUSTER_SECRET_FILE.key
        ))
    })?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.is_empty() {
        return Err(FluviaError::Config(format!(
            "secret file '{file}' is empty"
        )));
    }
    Ok(Some(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_tables_flatten_into_flink_keys() {
        let dir = std::env::temp_dir().join(format!("fluvia-toml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.toml");
        std::fs::write(
            &p,
            "[rest]\nport = 9000\n[taskmanager]\nnumberOfTaskSlots = 4\n",
        )
        .unwrap();
        let c = load(Some(&p), &["rest.port=9001".into()]).unwrap();
        assert_eq!(c.get(&REST_PORT).unwrap(), 9001);
        assert_eq!(c.get(&SLOTS).unwrap(), 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
