//! Client side of a cluster: submit a program, follow it to the end, list
//! and cancel jobs, and turn a finished job's report into the program's
//! [`JobExecutionResult`].

use crate::program::ProgramSpec;
use crate::rpc::job_manager_client::JobManagerClient;
use crate::rpc::{Empty, JobRequest, JobStatus, SubmitJobRequest};
use crate::security;
use fluvia_core::{FluviaError, Result};
use fluvia_graph::JobGraph;
use fluvia_runtime::JobExecutionResult;
use std::time::Duration;
use tonic::transport::Channel;

/// Calls the JobManager's RPC `$method` with `$req` and the cluster
/// secret; its reply, or the RPC error naming the address.
macro_rules! call {
    ($client:ident, $method:ident, $req:expr) => {
        $client
            .client
            .$method(security::authorize($req, &$client.secret))
            .await
            .map_err(|e| rpc_error(&$client.address, e))?
            .into_inner()
    };
}

#[derive(Clone)]
pub struct ClusterClient {
    client: JobManagerClient<Channel>,
    secret: Option<String>,
    address: String,
    /// The JobManager's REST address, learned when submitting.
    rest_address: Option<String>,
    /// Whether a job's status comes with its details (every vertex's JSON).
    details: bool,
}

fn rpc_error(address: &str, e: tonic::Status) -> FluviaError {
    match e.code() {
        tonic::Code::Unavailable => FluviaError::Execution(format!(
            "cannot reach the JobManager at {address}: {}",
            e.message()
        )),
        _ => FluviaError::Execution(format!("JobManager at {address}: {}", e.message())),
    }
}

impl ClusterClient {
    pub async fn connect(address: &str, secret: Option<String>) -> Result<Self> {
        let channel = Channel::from_shared(format!("http://{address}"))
            .map_err(|e| FluviaError::Config(format!("bad JobManager address '{address}': {e}")))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| {
                FluviaError::Execution(format!("cannot reach the JobManager at {address}: {e}"))
            })?;
        Ok(ClusterClient {
            client: JobManagerClient::new(channel)
                .max_decoding_message_size(crate::jobmanager::MAX_MESSAGE_SIZE)
                .max_encoding_message_size(crate::jobmanager::MAX_MESSAGE_SIZE),
            secret,
            address: address.to_string(),
            rest_address: None,
            details: true,
        })
    }

    /// With `false`, the statuses this client reads leave `details_json`
    /// empty unless a watcher is shown them: a caller that only needs the
    /// end (and the subtasks' results) does not wait for the JobManager to
    /// write the JSON of every vertex.
    pub fn set_details(&mut self, details: bool) {
        self.details = details;
    }

    /// Submits a job; it runs only on TaskManagers whose program
    /// fingerprint is `fingerprint` (the client binary's).
    pub async fn submit(
        &mut self,
        program: &ProgramSpec,
        graph: &JobGraph,
        fingerprint: &str,
    ) -> Result<String> {
        let req = SubmitJobRequest {
            program_json: serde_json::to_string(program)
                .map_err(|e| FluviaError::Serialization(e.to_string()))?,
            job_graph_json: serde_json::to_string(graph)
                .map_err(|e| FluviaError::Serialization(e.to_string()))?,
            program_fingerprint: fingerprint.to_string(),
        };
        let r = call!(self, submit_job, req);
        if !r.rest_address.is_empty() {
            self.rest_address = Some(r.rest_address);
        }
        Ok(r.job_id)
    }

    /// The Web UI page of a job this client submitted: the JobManager's
    /// REST address (with the host the client reached it by, when it
    /// listens on every address).
    pub fn web_ui(&self, job_id: &str) -> Option<String> {
        let rest = self.rest_address.as_ref()?;
        let (host, port) = rest.rsplit_once(':')?;
        let host = match host {
            "0.0.0.0" | "[::]" | "::" => self
                .address
                .rsplit_once(':')
                .map_or("127.0.0.1", |(h, _)| h),
            h => h,
        };
        Some(format!("http://{host}:{port}/#/jobs/{job_id}"))
    }

    pub async fn status(&mut self, job_id: &str) -> Result<JobStatus> {
        self.status_after(job_id, Duration::ZERO, self.details)
            .await
    }

    /// The job's status once it has ended, or after at most `wait`.
    async fn status_after(
        &mut self,
        job_id: &str,
        wait: Duration,
        details: bool,
    ) -> Result<JobStatus> {
        let req = JobRequest {
            job_id: job_id.into(),
            wait_ms: wait.as_millis() as u64,
            omit_details: !details,
        };
        Ok(call!(self, get_job, req))
    }

    /// Waits until the job is FINISHED, FAILED or CANCELED. The JobManager
    /// answers as soon as the job ends (a long poll of one second at most),
    /// so the end is seen within a round trip, not a polling interval.
    pub async fn wait(&mut self, job_id: &str) -> Result<JobStatus> {
        loop {
            let s = self
                .status_after(job_id, Duration::from_secs(1), self.details)
                .await?;
            if matches!(s.state.as_str(), "FINISHED" | "FAILED" | "CANCELED") {
                return Ok(s);
            }
        }
    }

    /// [`wait`](Self::wait), cancelling the job if `cancel` completes
    /// first and then waiting for it to end.
    pub async fn wait_until(
        &mut self,
        job_id: &str,
        cancel: impl std::future::Future<Output = ()>,
    ) -> Result<JobStatus> {
        self.wait_watching(job_id, cancel, None).await
    }

    /// [`wait_until`](Self::wait_until), showing `watch` the job's status
    /// about four times a second while it runs (progress on a terminal).
    pub async fn wait_watching(
        &mut self,
        job_id: &str,
        cancel: impl std::future::Future<Output = ()>,
        mut watch: Option<&mut (dyn FnMut(&JobStatus) + Send)>,
    ) -> Result<JobStatus> {
        let poll = if watch.is_some() {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(1)
        };
        // A progress display reads the details of every status it is shown.
        let details = self.details || watch.is_some();
        tokio::pin!(cancel);
        loop {
            let s = tokio::select! {
                s = self.status_after(job_id, poll, details) => s?,
                () = &mut cancel => break,
            };
            if matches!(s.state.as_str(), "FINISHED" | "FAILED" | "CANCELED") {
                return Ok(s);
            }
            if let Some(w) = watch.as_mut() {
                w(&s);
            }
        }
        // It may have ended meanwhile: then cancelling fails, and the
        // status below is how it ended.
        let _ = self.cancel(job_id).await;
        self.wait(job_id).await
    }

    pub async fn list(&mut self) -> Result<Vec<JobStatus>> {
        Ok(call!(self, list_jobs, Empty {}).jobs)
    }

    /// Triggers a savepoint of `job_id` (into a new directory under
    /// `target`, or `execution.checkpointing.savepoint-dir`); with `stop`
    /// the job ends after it. Waits for it and returns its location.
    pub async fn savepoint(
        &mut self,
        job_id: &str,
        target: Option<&str>,
        stop: bool,
        drain: bool,
    ) -> Result<String> {
        let req = crate::rpc::SavepointRequest {
            job_id: job_id.into(),
            target_directory: target.unwrap_or_default().into(),
            stop,
            drain,
        };
        let request_id = call!(self, trigger_savepoint, req).request_id;
        loop {
            let req = crate::rpc::SavepointStatusRequest {
                job_id: job_id.into(),
                request_id: request_id.clone(),
            };
            let status = call!(self, get_savepoint, req);
            if status.completed {
                if status.failure.is_empty() {
                    return Ok(status.location);
                }
                return Err(FluviaError::Execution(format!(
                    "savepoint of job {job_id} failed: {}",
                    status.failure
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    pub async fn cancel(&mut self, job_id: &str) -> Result<()> {
        let req = JobRequest {
            job_id: job_id.into(),
            ..Default::default()
        };
        call!(self, cancel_job, req);
        Ok(())
    }
}

/// The program's view of a job that ended: its result if it finished, else
/// an error with the job's failure cause.
pub fn job_result(
    graph: &JobGraph,
    status: &JobStatus,
    duration: Duration,
) -> Result<JobExecutionResult> {
    if status.state != "FINISHED" {
        let cause = if status.error.is_empty() {
            format!("job {} {}", status.job_id, status.state)
        } else {
            status.error.clone()
        };
        return Err(if status.state == "CANCELED" {
            FluviaError::Execution(format!("job {} was CANCELED", status.job_id))
        } else {
            FluviaError::Execution(cause)
        });
    }
    let reports = status
        .results
        .iter()
        .map(|r| {
            (
                r.vertex_index as usize,
                r.subtask as usize,
                r.attempt,
                r.metrics
                    .as_ref()
                    .map(crate::deployment::metrics_from_proto)
                    .unwrap_or_default(),
            )
        })
        .collect();
    let mut result = JobExecutionResult::from_reports(graph, duration, reports);
    result.checkpoints = serde_json::from_str(&status.checkpoints_json).ok();
    Ok(result)
}
