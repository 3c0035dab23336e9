//! The JobManager's REST API, in the shape of Flink's (paths, field names,
//! states, units; Fluvia's own data in extra fields): `/config`,
//! `/overview`, `/jobs`, `/jobs/overview`, `/jobs/:id`, `/jobs/:id/plan`,
//! `/jobs/:id/exceptions`, `/jobs/:id/config`, `/jobs/:id/vertices/:vid`,
//! `.../subtasks/metrics`, `.../subtasks/:n[/attempts/:a]`,
//! `.../backpressure`, `/taskmanagers[/:id]`, `/shuffle-services`,
//! Prometheus `/metrics`, and the Web UI at `/`. Cancelling (`PATCH
//! /jobs/:id?mode=cancel`, or Flink's dashboard's `GET
//! /jobs/:id/yarn-cancel`) is a mutation and needs the cluster secret in the
//! `X-Fluvia-Secret` header when one is configured.
//!
//! The JSON itself is built by [`crate::details`]; this module routes. It
//! reads the JobManager only through `ClusterQuery`.

use crate::details::View;
use crate::query::{ClusterQuery, ClusterView, read};
use crate::security;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use fluvia_core::JobId;
use fluvia_scheduler::JobState;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

type Shared = Arc<dyn ClusterQuery>;

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "errors": [what] }))).into_response()
}

async fn overview(State(s): State<Shared>) -> Json<Value> {
    read(&*s, |st| {
        let count = |state: JobState| st.scheduler.jobs().filter(|j| j.state == state).count();
        let total: usize = st.scheduler.task_managers().map(|(t, _)| t.slots).sum();
        let used: usize = st.scheduler.task_managers().map(|(_, used)| used).sum();
        Json(json!({
            "taskmanagers": st.scheduler.task_managers().count(),
            // Blocked by speculative execution: no new attempts go there.
            "taskmanagers-blocked": st
                .scheduler
                .task_managers()
                .filter(|(t, _)| st.scheduler.is_task_manager_blocked(&t.id))
                .count(),
            "shuffle-services": st.scheduler.shuffle_master().services().count(),
            "slots-total": total,
            "slots-available": total.saturating_sub(used),
            "jobs-running": st.scheduler.jobs().filter(|j| !j.state.is_terminal()).count(),
            "jobs-finished": count(JobState::Finished),
            "jobs-cancelled": count(JobState::Canceled),
            "jobs-failed": count(JobState::Failed),
            "flink-version": format!("fluvia {}", env!("CARGO_PKG_VERSION")),
            "flink-commit": env!("CARGO_PKG_VERSION"),
        }))
    })
}

async fn jobs(State(s): State<Shared>) -> Json<Value> {
    read(&*s, |st| {
        let jobs: Vec<Value> = st
            .scheduler
            .jobs()
            .map(|j| json!({ "id": j.id.to_string(), "status": j.state.name() }))
            .collect();
        Json(json!({ "jobs": jobs }))
    })
}

fn job_id(id: &str) -> Option<JobId> {
    JobId::try_from(id.to_string()).ok()
}

/// Runs `f` on the view of job `id`, or answers 404.
fn with_job(s: &Shared, id: &str, f: impl FnOnce(&View) -> Response) -> Response {
    read(&**s, |st| {
        let found = job_id(id).and_then(|j| Some((st.jobs.get(&j)?, st.scheduler.job(j)?)));
        match found {
            Some((meta, j)) => f(&View::new(st, meta, j)),
            None => not_found(format!("Job {id} not found")),
        }
    })
}

/// Runs `f` on vertex `vid` of job `id`, or answers 404.
fn with_vertex(
    s: &Shared,
    id: &str,
    vid: &str,
    f: impl FnOnce(&View, usize) -> Response,
) -> Response {
    with_job(s, id, |view| {
        match view
            .job
            .graph
            .vertices
            .iter()
            .position(|v| v.id.to_string() == vid)
        {
            Some(v) => f(view, v),
            None => not_found(format!("vertex {vid} not found in job {id}")),
        }
    })
}

async fn job(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    with_job(&s, &id, |view| Json(view.job_json()).into_response())
}

async fn jobs_overview(State(s): State<Shared>) -> Json<Value> {
    read(&*s, |st| {
        let mut jobs: Vec<Value> = st
            .jobs
            .values()
            .filter_map(|meta| {
                let j = st.scheduler.job(meta.graph.job_id)?;
                Some(View::new(st, meta, j).overview_json())
            })
            .collect();
        // Newest first, as Flink's dashboard lists them.
        jobs.sort_by(|a, b| b["start-time"].as_u64().cmp(&a["start-time"].as_u64()));
        Json(json!({ "jobs": jobs }))
    })
}

async fn plan(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    with_job(&s, &id, |view| {
        Json(json!({ "plan": view.plan_json() })).into_response()
    })
}

async fn exceptions(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let max = q
        .get("maxExceptions")
        .and_then(|m| m.parse().ok())
        .unwrap_or(usize::MAX);
    with_job(&s, &id, |view| {
        Json(view.exceptions_json(max)).into_response()
    })
}

/// A checkpoint's statistics as Flink's REST client reads them: the
/// `className` its polymorphic type is chosen by, and vertex ids (not
/// indices) as the keys of `tasks`.
fn flink_checkpoint(view: &View, mut c: Value) -> Value {
    let class = match c["status"].as_str() {
        Some("COMPLETED") => ".CompletedCheckpointStatistics",
        Some("FAILED") => ".FailedCheckpointStatistics",
        _ => ".PendingCheckpointStatistics",
    };
    c["className"] = json!(class);
    if c["is_savepoint"].as_bool() == Some(true) {
        c["savepointFormat"] = json!("CANONICAL");
    }
    if let Some(tasks) = c["tasks"].as_object() {
        let by_id: serde_json::Map<String, Value> = tasks
            .iter()
            .map(|(index, t)| {
                let id = index
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| view.job.graph.vertices.get(i))
                    .map_or_else(|| index.clone(), |v| v.id.to_string());
                (id, t.clone())
            })
            .collect();
        c["tasks"] = Value::Object(by_id);
    }
    c
}

/// Answers 401 unless the request presents the cluster secret (when one
/// is configured).
fn unauthorized(s: &Shared, headers: &HeaderMap, what: &str) -> Option<Response> {
    let presented = headers
        .get(security::SECRET_HEADER)
        .and_then(|v| v.to_str().ok());
    security::check(s.secret(), presented, what)
        .err()
        .map(|reason| {
            (
                StatusCode::UNAUTHORIZED,
                Json(json!({ "errors": [reason] })),
            )
                .into_response()
        })
}

fn savepoint_triggered(outcome: fluvia_core::Result<String>) -> Response {
    match outcome {
        Ok(request) => {
            (StatusCode::ACCEPTED, Json(json!({ "request-id": request }))).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(json!({ "errors": [e.to_string()] })),
        )
            .into_response(),
    }
}

/// `POST /jobs/:id/savepoints` {target-directory, cancel-job} (`STOP`
/// false), or `POST /jobs/:id/stop` {targetDirectory, drain}:
/// stop-with-savepoint (`STOP` true).
async fn savepoint<const STOP: bool>(
    State(s): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Option<Json<Value>>,
) -> Response {
    savepoint_request(&s, &id, &headers, body, STOP)
}

/// A savepoint request, as Flink's two endpoints spell their bodies.
fn savepoint_request(
    s: &Shared,
    id: &str,
    headers: &HeaderMap,
    body: Option<Json<Value>>,
    stop: bool,
) -> Response {
    let what = if stop {
        "REST POST /jobs/:id/stop"
    } else {
        "REST POST /jobs/:id/savepoints"
    };
    if let Some(r) = unauthorized(s, headers, what) {
        return r;
    }
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let (target, stop, drain) = if stop {
        let drain = body["drain"].as_bool().unwrap_or(false);
        (&body["targetDirectory"], true, drain)
    } else {
        let cancel = body["cancel-job"].as_bool().unwrap_or(false);
        (&body["target-directory"], cancel, false)
    };
    let target = target.as_str().map(str::to_string);
    savepoint_triggered(s.trigger_savepoint(id, target, stop, drain))
}

/// `GET /jobs/:id/savepoints/:trigger` (Flink's asynchronous operation
/// status).
async fn savepoint_status(
    State(s): State<Shared>,
    Path((id, trigger)): Path<(String, String)>,
) -> Response {
    use crate::checkpointing::SavepointOutcome;
    let outcome =
        job_id(&id).and_then(|j| read(&*s, |st| st.checkpoints.savepoint(j, &trigger).cloned()));
    match outcome {
        None => not_found(format!(
            "There is no savepoint operation with trigger id {trigger} for job {id}"
        )),
        Some(SavepointOutcome::InProgress) => {
            Json(json!({ "status": { "id": "IN_PROGRESS" } })).into_response()
        }
        Some(SavepointOutcome::Completed { location }) => Json(json!({
            "status": { "id": "COMPLETED" },
            "operation": { "location": location },
        }))
        .into_response(),
        Some(SavepointOutcome::Failed { reason }) => Json(json!({
            "status": { "id": "COMPLETED" },
            "operation": { "failure-cause": {
                "class": "org.apache.flink.runtime.checkpoint.CheckpointException",
                "stack-trace": reason,
                "serialized-throwable": null,
            } },
        }))
        .into_response(),
    }
}

/// `GET /jobs/:id/metrics[?get=a,b]`: the job's metrics as Flink names them
/// (without `get`, the list of their ids; values are strings).
async fn job_metrics(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    with_job(&s, &id, |view| {
        let stats = view.st.checkpoints.statistics(view.job.id);
        let completed = stats.as_ref().and_then(|s| s.latest.completed.as_ref());
        let mut metrics: Vec<(&str, String)> = vec![
            ("numRestarts", view.job.restarts.to_string()),
            (
                "uptime",
                if view.job.state == JobState::Running {
                    view.now.saturating_sub(view.meta.start_time).to_string()
                } else {
                    "0".to_string()
                },
            ),
        ];
        if let Some(st) = &stats {
            metrics.extend([
                (
                    "numberOfCompletedCheckpoints",
                    st.counts.completed.to_string(),
                ),
                ("numberOfFailedCheckpoints", st.counts.failed.to_string()),
                (
                    "numberOfInProgressCheckpoints",
                    st.counts.in_progress.to_string(),
                ),
                ("totalNumberOfCheckpoints", st.counts.total.to_string()),
                (
                    "lastCheckpointDuration",
                    completed
                        .map_or(-1, |c| c.end_to_end_duration as i64)
                        .to_string(),
                ),
                (
                    "lastCheckpointSize",
                    completed
                        .map_or(-1, |c| c.checkpointed_size as i64)
                        .to_string(),
                ),
                (
                    "lastCheckpointFullSize",
                    completed.map_or(-1, |c| c.state_size as i64).to_string(),
                ),
                (
                    "lastCheckpointRestoreTimestamp",
                    st.latest
                        .restored
                        .as_ref()
                        .map_or(-1, |r| r.restore_timestamp as i64)
                        .to_string(),
                ),
                (
                    "lastCheckpointExternalPath",
                    completed
                        .and_then(|c| c.external_path.clone())
                        .unwrap_or_else(|| "n/a".to_string()),
                ),
            ]);
        }
        let body: Vec<Value> = match q.get("get") {
            None => metrics.iter().map(|(k, _)| json!({ "id": k })).collect(),
            Some(wanted) => wanted
                .split(',')
                .filter_map(|w| metrics.iter().find(|(k, _)| *k == w.trim()))
                .map(|(k, v)| json!({ "id": k, "value": v }))
                .collect(),
        };
        Json(body).into_response()
    })
}

/// `GET /jobs/:id/checkpoints` (Flink's `CheckpointingStatistics`).
async fn checkpoints(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    with_job(&s, &id, |view| {
        let Some(stats) = view.st.checkpoints.statistics(view.job.id) else {
            return not_found(format!("Checkpointing is not enabled for job {id}"));
        };
        let mut body = serde_json::to_value(stats).unwrap_or_default();
        for key in ["completed", "savepoint", "failed"] {
            let c = body["latest"][key].take();
            body["latest"][key] = if c.is_null() {
                c
            } else {
                flink_checkpoint(view, c)
            };
        }
        if let Some(history) = body["history"].as_array_mut() {
            for c in history.iter_mut() {
                *c = flink_checkpoint(view, c.take());
            }
        }
        Json(body).into_response()
    })
}

/// `GET /jobs/:id/checkpoints/details/:cid`: one checkpoint of the history.
async fn checkpoint_details(
    State(s): State<Shared>,
    Path((id, cid)): Path<(String, String)>,
) -> Response {
    with_job(&s, &id, |view| {
        let found = view
            .st
            .checkpoints
            .statistics(view.job.id)
            .and_then(|stats| stats.history.into_iter().find(|c| c.id.to_string() == cid));
        match found {
            Some(c) => Json(flink_checkpoint(
                view,
                serde_json::to_value(c).unwrap_or_default(),
            ))
            .into_response(),
            None => not_found(format!(
                "Could not find checkpointing statistics for checkpoint {cid}."
            )),
        }
    })
}

/// `GET /jobs/:id/checkpoints/config` (Flink's `CheckpointConfigInfo`).
async fn checkpoints_config(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    with_job(&s, &id, |view| {
        let Some(c) = view.st.checkpoints.config(view.job.id) else {
            return not_found(format!("Checkpointing is not enabled for job {id}"));
        };
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        let retention = c.externalized_retention;
        use fluvia_scheduler::checkpoint::ExternalizedCheckpointRetention as R;
        Json(json!({
            "mode": match c.mode {
                fluvia_scheduler::checkpoint::CheckpointingMode::ExactlyOnce => "exactly_once",
                fluvia_scheduler::checkpoint::CheckpointingMode::AtLeastOnce => "at_least_once",
            },
            // Flink shows 0x7fffffffffffffff when periodic checkpoints are off.
            "interval": c.interval.map_or(i64::MAX as u64, ms),
            "timeout": ms(c.timeout),
            "min_pause": ms(c.min_pause),
            "max_concurrent": c.max_concurrent,
            "externalization": {
                "enabled": retention != R::NoExternalizedCheckpoints,
                "delete_on_cancellation": retention != R::RetainOnCancellation,
            },
            "state_backend": "HashMapStateBackend",
            "checkpoint_storage": "FileSystemCheckpointStorage",
            "unaligned_checkpoints": c.unaligned,
            "tolerable_failed_checkpoints": c.tolerable_failed.unwrap_or(0),
            "aligned_checkpoint_timeout": ms(c.aligned_checkpoint_timeout),
            "checkpoints_after_tasks_finish": true,
            "state_changelog_enabled": false,
            "changelog_periodic_materialization_interval": 600_000,
            "changelog_storage": "memory",
        }))
        .into_response()
    })
}

async fn job_config(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    with_job(&s, &id, |view| {
        let g = &view.job.graph;
        let config = &g.config;
        let user: serde_json::Map<String, Value> = config
            .iter()
            .map(|(k, v)| {
                let hidden = ["secret", "password", "token"]
                    .iter()
                    .any(|w| k.to_ascii_lowercase().contains(w));
                (k.to_string(), json!(if hidden { "******" } else { v }))
            })
            .collect();
        // The strategy the scheduler applies to this job.
        let restart = view.job.restart_strategy.describe();
        Json(json!({
            "jid": view.meta.id,
            "name": g.name,
            "execution-config": {
                "execution-mode": match g.job_type {
                    fluvia_graph::JobType::Batch => "BATCH",
                    fluvia_graph::JobType::Streaming => "PIPELINED",
                },
                "restart-strategy": restart,
                "job-parallelism": config
                    .get_raw("parallelism.default")
                    .and_then(|p| p.parse::<i64>().ok())
                    .unwrap_or(-1),
                "object-reuse-mode": config
                    .get_raw("pipeline.object-reuse")
                    .is_some_and(|v| v == "true"),
                "user-config": user,
            },
        }))
        .into_response()
    })
}

async fn vertex(State(s): State<Shared>, Path((id, vid)): Path<(String, String)>) -> Response {
    with_vertex(&s, &id, &vid, |view, v| {
        let mut out = view.vertex_json(v, true);
        out["now"] = json!(view.now);
        Json(out).into_response()
    })
}

async fn subtask_metrics(
    State(s): State<Shared>,
    Path((id, vid)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let list = |k: &str| -> Vec<String> {
        q.get(k)
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|x| !x.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let names = list("get");
    let aggs = list("agg");
    with_vertex(&s, &id, &vid, |view, v| {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let aggs: Vec<&str> = aggs.iter().map(String::as_str).collect();
        Json(view.subtask_metrics_json(v, &names, &aggs)).into_response()
    })
}

async fn subtask(
    State(s): State<Shared>,
    Path((id, vid, n)): Path<(String, String, String)>,
) -> Response {
    let Ok(n) = n.parse::<usize>() else {
        return not_found(format!("subtask {n} not found in vertex {vid}"));
    };
    with_vertex(&s, &id, &vid, |view, v| {
        match view.attempt_details(v, n, None) {
            Some(a) => Json(a).into_response(),
            None => not_found(format!("subtask {n} not found in vertex {vid}")),
        }
    })
}

async fn attempt(
    State(s): State<Shared>,
    Path((id, vid, n, a)): Path<(String, String, String, String)>,
) -> Response {
    let (Ok(n), Ok(a)) = (n.parse::<usize>(), a.parse::<u32>()) else {
        return not_found(format!(
            "attempt {a} of subtask {n} not found in vertex {vid}"
        ));
    };
    with_vertex(&s, &id, &vid, |view, v| {
        match view.attempt_details(v, n, Some(a)) {
            Some(a) => Json(a).into_response(),
            None => not_found(format!(
                "attempt {a} of subtask {n} not found in vertex {vid}"
            )),
        }
    })
}

async fn backpressure(
    State(s): State<Shared>,
    Path((id, vid)): Path<(String, String)>,
) -> Response {
    with_vertex(&s, &id, &vid, |view, v| {
        Json(view.backpressure_json(v)).into_response()
    })
}

/// Flink's dashboard configuration.
async fn config(State(s): State<Shared>) -> Json<Value> {
    Json(json!({
        "refresh-interval": s.web_refresh_interval().as_millis() as u64,
        "timezone-name": "UTC",
        "timezone-offset": 0,
        "flink-version": format!("fluvia {}", env!("CARGO_PKG_VERSION")),
        "flink-revision": format!("fluvia {}", env!("CARGO_PKG_VERSION")),
        "features": {
            "web-submit": false,
            "web-cancel": true,
            "web-rescale": false,
            "web-history": false,
        },
        // Cancelling from the UI asks for it.
        "secret-required": s.secret().is_some(),
    }))
}

async fn cancel(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let presented = headers
        .get(security::SECRET_HEADER)
        .and_then(|v| v.to_str().ok());
    if let Err(reason) = security::check(s.secret(), presented, "REST PATCH /jobs/:id") {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({ "errors": [reason] })),
        )
            .into_response();
    }
    if q.get("mode")
        .is_some_and(|m| !m.eq_ignore_ascii_case("cancel"))
    {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "errors": ["mode must be cancel"] })),
        )
            .into_response();
    }
    let known = job_id(&id).is_some_and(|j| read(&*s, |st| st.jobs.contains_key(&j)));
    if !known {
        return not_found(format!("Job {id} not found"));
    }
    match s.cancel_job(&id) {
        Ok(()) => (StatusCode::ACCEPTED, Json(json!({}))).into_response(),
        Err(e) => (
            StatusCode::CONFLICT,
            Json(json!({ "errors": [e.to_string()] })),
        )
            .into_response(),
    }
}

/// The registered shuffle services (a Fluvia addition beside Flink's API).
async fn shuffle_services(State(s): State<Shared>) -> Json<Value> {
    read(&*s, |st| {
        let services: Vec<Value> = st
            .scheduler
            .shuffle_master()
            .services()
            .map(|s| {
                json!({
                    "id": s.id,
                    "host": s.host,
                    "data-address": s.data_address,
                    "rpc-address": s.rpc_address,
                    "dir": s.dir,
                })
            })
            .collect();
        Json(json!({ "shuffle-services": services }))
    })
}

/// One TaskManager as Flink's TaskManagerInfo (resources Fluvia does not
/// measure are -1, Flink's "unknown").
fn taskmanager_json(
    st: &ClusterView<'_>,
    spec: &fluvia_scheduler::TaskManagerSpec,
    used: usize,
) -> Option<Value> {
    let t = st.task_managers.get(spec.id.as_str())?;
    let age = t.last_heartbeat.elapsed().as_millis() as u64;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let data_port = spec
        .data_address
        .rsplit(':')
        .next()
        .and_then(|p| p.parse::<u16>().ok())
        .map_or(-1, i64::from);
    let running = st
        .scheduler
        .jobs()
        .flat_map(|j| j.eg.vertices.iter())
        .flat_map(|v| &v.subtasks)
        .flat_map(|s| &s.attempts)
        .filter(|a| a.state.is_live() && a.task_manager.as_deref() == Some(spec.id.as_str()))
        .count();
    let unknown = json!({
        "cpuCores": -1.0, "taskHeapMemory": -1, "taskOffHeapMemory": -1,
        "managedMemory": -1, "networkMemory": -1, "extendedResources": {},
    });
    Some(json!({
        "id": spec.id,
        "path": st.tm_addresses.get(&spec.id),
        "dataPort": data_port,
        "jmxPort": -1,
        // Flink's name, Flink's meaning: when the last heartbeat came.
        "timeSinceLastHeartbeat": now.saturating_sub(age),
        "heartbeat-age-ms": age,
        "slotsNumber": spec.slots,
        "freeSlots": spec.slots.saturating_sub(used),
        "totalResource": unknown,
        "freeResource": unknown,
        "hardware": {"cpuCores": -1, "physicalMemory": -1, "freeMemory": -1, "managedMemory": -1},
        "blocked": st.scheduler.is_task_manager_blocked(&spec.id),
        "dataAddress": spec.data_address,
        "programFingerprint": spec.fingerprint,
        "running-tasks": running,
    }))
}

async fn taskmanagers(State(s): State<Shared>) -> Json<Value> {
    read(&*s, |st| {
        let tms: Vec<Value> = st
            .scheduler
            .task_managers()
            .filter_map(|(spec, used)| taskmanager_json(st, spec, used))
            .collect();
        Json(json!({ "taskmanagers": tms }))
    })
}

async fn taskmanager(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    read(&*s, |st| {
        let Some(mut out) = st
            .scheduler
            .task_managers()
            .find(|(spec, _)| spec.id == id)
            .and_then(|(spec, used)| taskmanager_json(st, spec, used))
        else {
            return not_found(format!("TaskManager {id} not found"));
        };
        let tasks: Vec<Value> = st
            .task_managers
            .get(id.as_str())
            .and_then(|t| serde_json::from_str::<Vec<Value>>(&t.metrics_json).ok())
            .unwrap_or_default();
        let allocated: Vec<Value> = st
            .scheduler
            .jobs()
            .flat_map(|j| {
                j.slots
                    .values()
                    .filter(|slot| slot.task_manager == id)
                    .map(move |slot| json!({ "jobId": j.id.to_string(), "slot-sharing-group": slot.group, "resource": {} }))
            })
            .collect();
        out["allocatedSlots"] = json!(allocated);
        out["metrics"] = json!({});
        out["tasks"] = json!(tasks);
        Json(out).into_response()
    })
}

/// The Web UI: three files built into the binary (no network, no Node).
async fn web_index() -> Response {
    (
        [("content-type", "text/html; charset=utf-8")],
        include_str!("web/index.html"),
    )
        .into_response()
}

async fn web_script() -> Response {
    (
        [("content-type", "text/javascript; charset=utf-8")],
        include_str!("web/app.js"),
    )
        .into_response()
}

async fn web_style() -> Response {
    (
        [("content-type", "text/css; charset=utf-8")],
        include_str!("web/style.css"),
    )
        .into_response()
}

async fn metrics(State(s): State<Shared>) -> Response {
    read(&*s, |st| {
        let mut out = String::new();
        let total: usize = st.scheduler.task_managers().map(|(t, _)| t.slots).sum();
        let _ = writeln!(out, "# TYPE fluvia_jobmanager_taskmanagers gauge");
        let _ = writeln!(
            out,
            "fluvia_jobmanager_taskmanagers {}",
            st.scheduler.task_managers().count()
        );
        let _ = writeln!(out, "# TYPE fluvia_jobmanager_slots_total gauge");
        let _ = writeln!(out, "fluvia_jobmanager_slots_total {total}");
        let _ = writeln!(out, "# TYPE fluvia_jobmanager_jobs gauge");
        for state in [
            JobState::Running,
            JobState::Finished,
            JobState::Failed,
            JobState::Canceled,
            JobState::Restarting,
        ] {
            let n = st.scheduler.jobs().filter(|j| j.state == state).count();
            let _ = writeln!(
                out,
                "fluvia_jobmanager_jobs{{state=\"{}\"}} {n}",
                state.name()
            );
        }
        // Speculative execution: Flink's numSlowExecutionVertices and
        // numEffectiveSpeculativeExecutions per job, and blocked TaskManagers.
        let blocked = st
            .scheduler
            .task_managers()
            .filter(|(t, _)| st.scheduler.is_task_manager_blocked(&t.id))
            .count();
        let _ = writeln!(out, "# TYPE fluvia_jobmanager_taskmanagers_blocked gauge");
        let _ = writeln!(out, "fluvia_jobmanager_taskmanagers_blocked {blocked}");
        let _ = writeln!(out, "# TYPE fluvia_job_num_slow_execution_vertices gauge");
        for j in st.scheduler.jobs().filter(|j| j.speculative.is_some()) {
            let _ = writeln!(
                out,
                "fluvia_job_num_slow_execution_vertices{{job_id=\"{}\"}} {}",
                j.id, j.num_slow_execution_vertices
            );
        }
        let _ = writeln!(
            out,
            "# TYPE fluvia_job_num_effective_speculative_executions counter"
        );
        for j in st.scheduler.jobs().filter(|j| j.speculative.is_some()) {
            let _ = writeln!(
                out,
                "fluvia_job_num_effective_speculative_executions{{job_id=\"{}\"}} {}",
                j.id, j.num_effective_speculative_executions
            );
        }
        let fields = [
            ("fluvia_task_records_in_total", "records_in", "counter"),
            ("fluvia_task_records_out_total", "records_out", "counter"),
            ("fluvia_task_bytes_in_total", "bytes_in", "counter"),
            ("fluvia_task_bytes_out_total", "bytes_out", "counter"),
            (
                "fluvia_task_busy_time_ms_per_second",
                "busy_ms_per_second",
                "gauge",
            ),
            (
                "fluvia_task_back_pressured_time_ms_per_second",
                "back_pressured_ms_per_second",
                "gauge",
            ),
            (
                "fluvia_task_idle_time_ms_per_second",
                "idle_ms_per_second",
                "gauge",
            ),
            ("fluvia_task_out_pool_usage", "out_pool_usage", "gauge"),
            ("fluvia_task_in_pool_usage", "in_pool_usage", "gauge"),
        ];
        let tasks: Vec<(String, Value)> = st
            .task_managers
            .iter()
            .flat_map(|(id, t)| {
                serde_json::from_str::<Vec<Value>>(&t.metrics_json)
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |v| (id.to_string(), v))
            })
            .collect();
        for (name, key, kind) in fields {
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (tm, v) in &tasks {
                let task = v["task"]
                    .as_str()
                    .unwrap_or("")
                    .replace('\\', "\\\\")
                    .replace('"', "\\\"");
                let _ = writeln!(
                    out,
                    "{name}{{taskmanager=\"{tm}\",job_id=\"{}\",task=\"{task}\",subtask=\"{}\"}} {}",
                    v["job_id"].as_str().unwrap_or(""),
                    v["subtask"],
                    v[key].as_f64().unwrap_or(0.0)
                );
            }
        }
        ([("content-type", "text/plain; version=0.0.4")], out).into_response()
    })
}

/// Serves the REST API until the process stops.
pub(crate) async fn serve(listener: tokio::net::TcpListener, shared: Shared) {
    // Flink serves every path under /v1 too (what its REST client calls).
    let app = Router::new()
        .route("/", get(web_index))
        .route("/app.js", get(web_script))
        .route("/style.css", get(web_style))
        .merge(api())
        .nest("/v1", api())
        .fallback(|uri: axum::http::Uri| async move { not_found(format!("Not found: {uri}")) })
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("REST server stopped: {e}");
    }
}

fn api() -> Router<Shared> {
    Router::new()
        .route("/config", get(config))
        .route("/overview", get(overview))
        .route("/jobs", get(jobs))
        .route("/jobs/overview", get(jobs_overview))
        .route("/jobs/{id}", get(job).patch(cancel))
        .route("/jobs/{id}/yarn-cancel", get(cancel))
        .route("/jobs/{id}/plan", get(plan))
        .route("/jobs/{id}/exceptions", get(exceptions))
        .route("/jobs/{id}/config", get(job_config))
        .route("/jobs/{id}/checkpoints", get(checkpoints))
        .route("/jobs/{id}/metrics", get(job_metrics))
        .route(
            "/jobs/{id}/savepoints",
            axum::routing::post(savepoint::<false>),
        )
        .route("/jobs/{id}/savepoints/{trigger}", get(savepoint_status))
        .route("/jobs/{id}/stop", axum::routing::post(savepoint::<true>))
        .route("/jobs/{id}/checkpoints/config", get(checkpoints_config))
        .route(
            "/jobs/{id}/checkpoints/details/{cid}",
            get(checkpoint_details),
        )
        .route("/jobs/{id}/vertices/{vid}", get(vertex))
        .route(
            "/jobs/{id}/vertices/{vid}/subtasks/metrics",
            get(subtask_metrics),
        )
        .route("/jobs/{id}/vertices/{vid}/subtasks/{n}", get(subtask))
        .route(
            "/jobs/{id}/vertices/{vid}/subtasks/{n}/attempts/{a}",
            get(attempt),
        )
        .route("/jobs/{id}/vertices/{vid}/backpressure", get(backpressure))
        .route("/taskmanagers", get(taskmanagers))
        .route("/taskmanagers/{id}", get(taskmanager))
        .route("/shuffle-services", get(shuffle_services))
        .route("/metrics", get(metrics))
}
