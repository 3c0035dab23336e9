//! Client side of a cluster: submit a program, follow it to the end, list
//! and cancel jobs.

use crate::program::ProgramSpec;
use crate::rpc::job_manager_client::JobManagerClient;
use crate::rpc::{Empty, JobRequest, JobStatus, SubmitJobRequest};
use crate::security;
use fluvia_core::{FluviaError, Result};
use fluvia_graph::JobGraph;
use std::time::Duration;
use tonic::transport::Channel;

pub struct ClusterClient {
    client: JobManagerClient<Channel>,
    secret: Option<String>,
    address: String,
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
            client: JobManagerClient::new(channel),
            secret,
            address: address.to_string(),
        })
    }

    pub async fn submit(&mut self, program: &ProgramSpec, graph: &JobGraph) -> Result<String> {
        let req = SubmitJobRequest {
            program_json: serde_json::to_string(program)
                .map_err(|e| FluviaError::Serialization(e.to_string()))?,
            job_graph_json: serde_json::to_string(graph)
                .map_err(|e| FluviaError::Serialization(e.to_string()))?,
        };
        let r = self
            .client
            .submit_job(security::authorize(req, &self.secret))
            .await
            .map_err(|e| rpc_error(&self.address, e))?;
        Ok(r.into_inner().job_id)
    }

    pub async fn status(&mut self, job_id: &str) -> Result<JobStatus> {
        let req = JobRequest {
            job_id: job_id.into(),
        };
        Ok(self
            .client
            .get_job(security::authorize(req, &self.secret))
            .await
            .map_err(|e| rpc_error(&self.address, e))?
            .into_inner())
    }

    /// Polls until the job is FINISHED, FAILED or CANCELED: often at first
    /// (short jobs end within milliseconds), then every 100 ms.
    pub async fn wait(&mut self, job_id: &str) -> Result<JobStatus> {
        let mut pause = Duration::from_millis(2);
        loop {
            let s = self.status(job_id).await?;
            if matches!(s.state.as_str(), "FINISHED" | "FAILED" | "CANCELED") {
                return Ok(s);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    pub async fn list(&mut self) -> Result<Vec<JobStatus>> {
        Ok(self
            .client
            .list_jobs(security::authorize(Empty {}, &self.secret))
            .await
            .map_err(|e| rpc_error(&self.address, e))?
            .into_inner()
            .jobs)
    }

    pub async fn cancel(&mut self, job_id: &str) -> Result<()> {
        let req = JobRequest {
            job_id: job_id.into(),
        };
        self.client
            .cancel_job(security::authorize(req, &self.secret))
            .await
            .map_err(|e| rpc_error(&self.address, e))?;
        Ok(())
    }
}
