//! The JobManager's REST API, in the shape of Flink's: `/overview`, `/jobs`,
//! `/jobs/:id`, `/jobs/:id/plan`, `/jobs/:id/vertices/:vid`,
//! `/taskmanagers`, `/shuffle-services`, and Prometheus `/metrics`. Cancelling
//! (`PATCH /jobs/:id?mode=cancel`) is a mutation and needs the cluster secret
//! in the `X-Fluvia-Secret` header when one is configured.

use crate::jobmanager::{JmShared, JobState, lock};
use crate::security;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use fluvia_core::JobId;
use fluvia_graph::plan::json_plan_with;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::fmt::Write;
use std::sync::Arc;

type Shared = Arc<JmShared>;

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, Json(json!({ "errors": [what] }))).into_response()
}

async fn overview(State(s): State<Shared>) -> Json<Value> {
    let st = lock(&s.state);
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
    }))
}

async fn jobs(State(s): State<Shared>) -> Json<Value> {
    let st = lock(&s.state);
    let jobs: Vec<Value> = st
        .scheduler
        .jobs()
        .map(|j| json!({ "id": j.id.to_string(), "status": j.state.name() }))
        .collect();
    Json(json!({ "jobs": jobs }))
}

fn job_id(id: &str) -> Option<JobId> {
    JobId::try_from(id.to_string()).ok()
}

async fn job(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let st = lock(&s.state);
    let found = job_id(&id).and_then(|j| Some((st.jobs.get(&j)?, st.scheduler.job(j)?)));
    match found {
        Some((meta, j)) => Json(s.job_details(&st, meta, j)).into_response(),
        None => not_found(format!("job {id} not found")),
    }
}

async fn plan(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let st = lock(&s.state);
    match job_id(&id).and_then(|j| st.jobs.get(&j)) {
        Some(j) => {
            // The parallelism as the scheduler stands now (undecided: -1).
            let parallelism: Vec<Option<usize>> = match st.scheduler.job(j.graph.job_id) {
                Some(job) => job
                    .eg
                    .vertices
                    .iter()
                    .map(|v| v.parallelism_decided.then_some(v.parallelism))
                    .collect(),
                None => j
                    .graph
                    .vertices
                    .iter()
                    .map(|v| Some(v.parallelism))
                    .collect(),
            };
            Json(json!({ "plan": json_plan_with(&j.graph, &parallelism) })).into_response()
        }
        None => not_found(format!("job {id} not found")),
    }
}

async fn vertex(State(s): State<Shared>, Path((id, vid)): Path<(String, String)>) -> Response {
    let st = lock(&s.state);
    let Some((meta, j)) = job_id(&id).and_then(|j| Some((st.jobs.get(&j)?, st.scheduler.job(j)?)))
    else {
        return not_found(format!("job {id} not found"));
    };
    let details = s.job_details(&st, meta, j);
    let found = details["vertices"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["id"] == vid.as_str()).cloned());
    match found {
        Some(mut v) => {
            v["now"] = details["now"].clone();
            Json(v).into_response()
        }
        None => not_found(format!("vertex {vid} not found in job {id}")),
    }
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
    if let Err(reason) = security::check(&s.secret, presented, "REST PATCH /jobs/:id") {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({ "errors": [reason] })),
        )
            .into_response();
    }
    if q.get("mode").is_some_and(|m| m != "cancel") {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({ "errors": ["mode must be cancel"] })),
        )
            .into_response();
    }
    match s.cancel(&id) {
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
    let st = lock(&s.state);
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
}

async fn taskmanagers(State(s): State<Shared>) -> Json<Value> {
    let st = lock(&s.state);
    let tms: Vec<Value> = st
        .scheduler
        .task_managers()
        .filter_map(|(spec, used)| st.tms.get(&spec.id).map(|t| (spec, t, used)))
        .map(|(spec, t, used)| {
            json!({
                "id": spec.id,
                "path": st.tm_addresses.get(&spec.id),
                "dataAddress": spec.data_address,
                "slotsNumber": spec.slots,
                "freeSlots": spec.slots.saturating_sub(used),
                "programFingerprint": spec.fingerprint,
                "timeSinceLastHeartbeat": t.last_heartbeat.elapsed().as_millis() as u64,
                "blocked": st.scheduler.is_task_manager_blocked(&spec.id),
            })
        })
        .collect();
    Json(json!({ "taskmanagers": tms }))
}

async fn metrics(State(s): State<Shared>) -> Response {
    let st = lock(&s.state);
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
        .tms
        .iter()
        .flat_map(|(id, t)| {
            serde_json::from_str::<Vec<Value>>(&t.metrics_json)
                .unwrap_or_default()
                .into_iter()
                .map(move |v| (id.clone(), v))
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
}

/// Serves the REST API until the process stops.
pub(crate) async fn serve(listener: tokio::net::TcpListener, shared: Arc<JmShared>) {
    let app = Router::new()
        .route("/overview", get(overview))
        .route("/jobs", get(jobs))
        .route("/jobs/{id}", get(job).patch(cancel))
        .route("/jobs/{id}/plan", get(plan))
        .route("/jobs/{id}/vertices/{vid}", get(vertex))
        .route("/taskmanagers", get(taskmanagers))
        .route("/shuffle-services", get(shuffle_services))
        .route("/metrics", get(metrics))
        .with_state(shared);
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!("REST server stopped: {e}");
    }
}
