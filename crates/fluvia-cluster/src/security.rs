//! The cluster secret: every RPC carries it as metadata, REST mutations as a
//! header. A request with a wrong or missing secret is refused and the
//! refusal is logged with its reason.

use tonic::{Request, Status};

/// gRPC metadata key (and REST header) that carries the secret.
pub const SECRET_HEADER: &str = "x-fluvia-secret";

/// Attaches the secret (if any) to an outgoing request.
pub fn authorize<T>(message: T, secret: &Option<String>) -> Request<T> {
    let mut req = Request::new(message);
    if let Some(s) = secret
        && let Ok(v) = s.parse()
    {
        req.metadata_mut().insert(SECRET_HEADER, v);
    }
    req
}

/// Checks a presented secret; `what` names the endpoint for the log.
pub fn check(expected: &Option<String>, presented: Option<&str>, what: &str) -> Result<(), String> {
    let Some(expected) = expected else {
        return Ok(());
    };
    match presented {
        None => {
            let reason = format!("{what}: refused, no cluster secret presented");
            tracing::warn!("{reason}");
            Err(reason)
        }
        Some(p) if constant_time_eq(p.as_bytes(), expected.as_bytes()) => Ok(()),
        Some(_) => {
            let reason = format!("{what}: refused, wrong cluster secret");
            tracing::warn!("{reason}");
            Err(reason)
        }
    }
}

/// Checks an incoming gRPC request.
pub fn check_request<T>(
    expected: &Option<String>,
    req: &Request<T>,
    what: &str,
) -> Result<(), Status> {
    let presented = req
        .metadata()
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok());
    check(expected, presented, what).map_err(Status::unauthenticated)
}

/// [`check_request`], then the request's message.
pub fn authorized<T>(expected: &Option<String>, req: Request<T>, what: &str) -> Result<T, Status> {
    check_request(expected, &req, what)?;
    Ok(req.into_inner())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
