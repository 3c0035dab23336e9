//! Cluster configuration: Flink's key names, from a file (flat YAML as in
//! `flink-conf.yaml`, or TOML) plus `-D key=value` overrides.

use fluvia_core::config::ConfigOption;
use fluvia_core::{Configuration, FluviaError, Result};
use std::path::Path;
use std::time::Duration;

pub const JOBMANAGER_ADDRESS: ConfigOption<&'static str> = ConfigOption {
    key: "jobmanager.rpc.address",
    fallback_keys: &[],
    default: "127.0.0.1",
    description: "Address the JobManager binds its RPC server to (loopback by default).",
};
pub const JOBMANAGER_PORT: ConfigOption<usize> = ConfigOption {
    key: "jobmanager.rpc.port",
    fallback_keys: &[],
    default: 6123,
    description: "RPC port of the JobManager (0 picks a free port).",
};
pub const REST_ADDRESS: ConfigOption<&'static str> = ConfigOption {
    key: "rest.address",
    fallback_keys: &["rest.bind-address"],
    default: "127.0.0.1",
    description: "Address of the REST API.",
};
pub const REST_PORT: ConfigOption<usize> = ConfigOption {
    key: "rest.port",
    fallback_keys: &[],
    default: 8081,
    description: "Port of the REST API (0 picks a free port).",
};
pub const TASKMANAGER_HOST: ConfigOption<&'static str> = ConfigOption {
    key: "taskmanager.host",
    fallback_keys: &[],
    default: "127.0.0.1",
    description: "Address a TaskManager binds its RPC and data servers to.",
};
pub const TASKMANAGER_RPC_PORT: ConfigOption<usize> = ConfigOption {
    key: "taskmanager.rpc.port",
    fallback_keys: &[],
    default: 0,
    description: "RPC port of a TaskManager (0 picks a free port).",
};
pub const TASKMANAGER_DATA_PORT: ConfigOption<usize> = ConfigOption {
    key: "taskmanager.data.port",
    fallback_keys: &[],
    default: 0,
    description: "Data port of a TaskManager (0 picks a free port).",
};
pub const SLOTS: ConfigOption<usize> = ConfigOption {
    key: "taskmanager.numberOfTaskSlots",
    fallback_keys: &[],
    default: 1,
    description: "Slots of a TaskManager.",
};
pub const HEARTBEAT_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "heartbeat.interval",
    fallback_keys: &[],
    default: Duration::from_secs(10),
    description: "How often a TaskManager reports to the JobManager.",
};
pub const METRICS_UPDATE_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "metrics.fetcher.update-interval",
    fallback_keys: &[],
    default: Duration::from_secs(1),
    description: "How old the live task metrics of the REST API and Web UI may be: while tasks \
                  run, a TaskManager reports them this often (between heartbeats).",
};
pub const WEB_REFRESH_INTERVAL: ConfigOption<Duration> = ConfigOption {
    key: "web.refresh-interval",
    fallback_keys: &[],
    default: Duration::from_secs(1),
    description: "How often the Web UI refreshes what it shows.",
};
pub const HEARTBEAT_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "heartbeat.timeout",
    fallback_keys: &[],
    default: Duration::from_secs(50),
    description: "Silence after which a TaskManager is declared lost.",
};
pub const RESTART_STRATEGY: ConfigOption<&'static str> = ConfigOption {
    key: "restart-strategy.type",
    fallback_keys: &["restart-strategy"],
    default: "none",
    description: "none or fixed-delay.",
};
pub const RESTART_ATTEMPTS: ConfigOption<usize> = ConfigOption {
    key: "restart-strategy.fixed-delay.attempts",
    fallback_keys: &[],
    default: 1,
    description: "Restarts allowed by the fixed-delay strategy.",
};
pub const RESTART_DELAY: ConfigOption<Duration> = ConfigOption {
    key: "restart-strategy.fixed-delay.delay",
    fallback_keys: &[],
    default: Duration::from_secs(1),
    description: "Wait before a restart.",
};
pub const SLOT_REQUEST_TIMEOUT: ConfigOption<Duration> = ConfigOption {
    key: "slot.request.timeout",
    fallback_keys: &[],
    default: Duration::from_secs(300),
    description: "How long a job waits for enough slots before it fails.",
};
pub const CLUSTER_SECRET: ConfigOption<&'static str> = ConfigOption {
    key: "security.cluster-secret",
    fallback_keys: &[],
    default: "",
    description: "Shared secret every RPC, data connection and REST mutation must present.",
};
pub const CLUSTER_SECRET_FILE: ConfigOption<&'static str> = ConfigOption {
    key: "security.cluster-secret.file",
    fallback_keys: &[],
    default: "",
    description: "File whose first line is the cluster secret.",
};

/// (key, default, description) of the cluster options, for `fluvia config`.
pub const SHUFFLE_SERVICE_TYPE: ConfigOption<&'static str> = ConfigOption {
    key: "shuffle-service.type",
    fallback_keys: &[],
    default: "internal",
    description: "Where blocking partitions are served from: internal (the producing \
                  TaskManager) or external (the `fluvia shuffle-service` of its host). Set on \
                  the JobManager as the default, or per job.",
};
pub const SHUFFLE_SERVICE_HOST: ConfigOption<&'static str> = ConfigOption {
    key: "shuffle-service.host",
    fallback_keys: &[],
    default: "127.0.0.1",
    description: "Address a shuffle service binds to; TaskManagers whose data address is on \
                  this host hand their partitions to it.",
};
pub const SHUFFLE_SERVICE_DATA_PORT: ConfigOption<usize> = ConfigOption {
    key: "shuffle-service.data.port",
    fallback_keys: &[],
    default: 0,
    description: "Data port of a shuffle service (0 picks a free port).",
};
pub const SHUFFLE_SERVICE_RPC_PORT: ConfigOption<usize> = ConfigOption {
    key: "shuffle-service.rpc.port",
    fallback_keys: &[],
    default: 0,
    description: "RPC port of a shuffle service (0 picks a free port).",
};
pub const SHUFFLE_SERVICE_DIR: ConfigOption<&'static str> = ConfigOption {
    key: "shuffle-service.dir",
    fallback_keys: &[],
    default: "",
    description: "Directory of a shuffle service's partition files (empty: \
                  <io.tmp.dirs>/fluvia-shuffle-service).",
};

pub fn all() -> Vec<(&'static str, String, &'static str)> {
    fn d(o: &ConfigOption<Duration>) -> String {
        format!("{} ms", o.default.as_millis())
    }
    vec![
        (
            SHUFFLE_SERVICE_TYPE.key,
            SHUFFLE_SERVICE_TYPE.default.into(),
            SHUFFLE_SERVICE_TYPE.description,
        ),
        (
            SHUFFLE_SERVICE_HOST.key,
            SHUFFLE_SERVICE_HOST.default.into(),
            SHUFFLE_SERVICE_HOST.description,
        ),
        (
            SHUFFLE_SERVICE_DATA_PORT.key,
            SHUFFLE_SERVICE_DATA_PORT.default.to_string(),
            SHUFFLE_SERVICE_DATA_PORT.description,
        ),
        (
            SHUFFLE_SERVICE_RPC_PORT.key,
            SHUFFLE_SERVICE_RPC_PORT.default.to_string(),
            SHUFFLE_SERVICE_RPC_PORT.description,
        ),
        (
            SHUFFLE_SERVICE_DIR.key,
            SHUFFLE_SERVICE_DIR.default.into(),
            SHUFFLE_SERVICE_DIR.description,
        ),
        (
            JOBMANAGER_ADDRESS.key,
            JOBMANAGER_ADDRESS.default.into(),
            JOBMANAGER_ADDRESS.description,
        ),
        (
            JOBMANAGER_PORT.key,
            JOBMANAGER_PORT.default.to_string(),
            JOBMANAGER_PORT.description,
        ),
        (
            REST_ADDRESS.key,
            REST_ADDRESS.default.into(),
            REST_ADDRESS.description,
        ),
        (
            REST_PORT.key,
            REST_PORT.default.to_string(),
            REST_PORT.description,
        ),
        (
            TASKMANAGER_HOST.key,
            TASKMANAGER_HOST.default.into(),
            TASKMANAGER_HOST.description,
        ),
        (
            TASKMANAGER_RPC_PORT.key,
            TASKMANAGER_RPC_PORT.default.to_string(),
            TASKMANAGER_RPC_PORT.description,
        ),
        (
            TASKMANAGER_DATA_PORT.key,
            TASKMANAGER_DATA_PORT.default.to_string(),
            TASKMANAGER_DATA_PORT.description,
        ),
        (SLOTS.key, SLOTS.default.to_string(), SLOTS.description),
        (
            HEARTBEAT_INTERVAL.key,
            d(&HEARTBEAT_INTERVAL),
            HEARTBEAT_INTERVAL.description,
        ),
        (
            HEARTBEAT_TIMEOUT.key,
            d(&HEARTBEAT_TIMEOUT),
            HEARTBEAT_TIMEOUT.description,
        ),
        (
            METRICS_UPDATE_INTERVAL.key,
            d(&METRICS_UPDATE_INTERVAL),
            METRICS_UPDATE_INTERVAL.description,
        ),
        (
            WEB_REFRESH_INTERVAL.key,
            d(&WEB_REFRESH_INTERVAL),
            WEB_REFRESH_INTERVAL.description,
        ),
        (
            RESTART_STRATEGY.key,
            RESTART_STRATEGY.default.into(),
            RESTART_STRATEGY.description,
        ),
        (
            RESTART_ATTEMPTS.key,
            RESTART_ATTEMPTS.default.to_string(),
            RESTART_ATTEMPTS.description,
        ),
        (
            RESTART_DELAY.key,
            d(&RESTART_DELAY),
            RESTART_DELAY.description,
        ),
        (
            SLOT_REQUEST_TIMEOUT.key,
            d(&SLOT_REQUEST_TIMEOUT),
            SLOT_REQUEST_TIMEOUT.description,
        ),
        (
            CLUSTER_SECRET.key,
            "(none)".into(),
            CLUSTER_SECRET.description,
        ),
        (
            CLUSTER_SECRET_FILE.key,
            "(none)".into(),
            CLUSTER_SECRET_FILE.description,
        ),
    ]
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
