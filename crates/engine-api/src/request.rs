//! What every request of every Engine API router goes through around its handler, as the Docker Engine does it:
//! the body is read in full first (bounded in size and time, so an answer, an error or a 404 included, is only
//! sent once the client has finished sending: no `broken pipe` on the client), the `/v1.NN` prefix is checked
//! (1.24 up to 1.47) and stripped, every error answer is JSON `{"message": ...}` (axum's rejections and empty
//! 405s included), and request bodies are decoded as Go would (`json_body`).
//!
//! Must not depend on the store, Raft or the executors.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::error::ApiError;
use crate::json::ErrorResponse;

/// The largest request body read (the Raft proposal limit is 8 MiB; a spec this size already cannot hold
/// its tasks). Beyond it: 413.
pub const BODY_LIMIT_BYTES: usize = 4 << 20;

/// The oldest API version answered (what Docker 28 reports as its minimum).
pub const MIN_API_VERSION: (u32, u32) = (1, 24);

/// The newest API version answered.
pub const MAX_API_VERSION: (u32, u32) = (1, 47);

/// The API version a request names with its `/v1.NN` prefix, or the newest served when it names none (as the
/// engine takes a request without a version to be of its own). Set by `api_version` as a request extension;
/// handlers whose reading or answer depends on it take it as an extractor (`versions` lists the differences).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ApiVersion(pub u32, pub u32);

impl ApiVersion {
    /// The newest version served.
    pub const NEWEST: ApiVersion = ApiVersion(MAX_API_VERSION.0, MAX_API_VERSION.1);

    /// Whether this version is older than `major.minor` (Docker's `versions.LessThan`).
    pub fn less_than(self, major: u32, minor: u32) -> bool {
        self < ApiVersion(major, minor)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ApiVersion {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<ApiVersion>().copied().unwrap_or(ApiVersion::NEWEST))
    }
}

/// How long a request's body may take to arrive, once its headers are in (a request extension set by the
/// connection server; 30 s when absent).
#[derive(Debug, Clone, Copy)]
pub struct BodyReadTimeout(pub Duration);

const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

fn error(status: StatusCode, message: String) -> Response {
    let mut r = (status, axum::Json(ErrorResponse { message })).into_response();
    // axum's Json sets this already; the engine sends exactly this value.
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// Reads the whole body (up to `BODY_LIMIT_BYTES`, within the body read timeout) before the request goes on,
/// so that whatever answers it answers after the client finished sending.
pub(crate) async fn read_body_first(req: Request, next: Next) -> Response {
    let timeout = req.extensions().get::<BodyReadTimeout>().map_or(DEFAULT_BODY_READ_TIMEOUT, |t| t.0);
    let (parts, body) = req.into_parts();
    let read = Limited::new(body, BODY_LIMIT_BYTES).collect();
    let bytes: Bytes = match tokio::time::timeout(timeout, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body too large: the limit is {BODY_LIMIT_BYTES} bytes"),
            );
        }
        Ok(Err(e)) => {
            return error(StatusCode::BAD_REQUEST, format!("the request body could not be read: {e}"));
        }
        Err(_) => {
            return error(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {} s", timeout.as_secs_f64()),
            );
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// Makes every error answer JSON `{"message": ...}` with `Content-Type: application/json`: an answer of 400 or
/// more in another type (axum's rejections are text, its 405 is empty) keeps its status, and its text, or the
/// status's reason when empty, becomes the message.
pub(crate) async fn json_errors(req: Request, next: Next) -> Response {
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.as_u16() < 400 || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 << 10).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let message = if text.is_empty() {
        match status {
            StatusCode::METHOD_NOT_ALLOWED => "method not allowed".to_string(),
            s => s.canonical_reason().unwrap_or("error").to_ascii_lowercase(),
        }
    } else {
        text
    };
    let mut out = error(status, message);
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// The API version a path asks for (`/v1.47/...`), and the path without it.
pub(crate) fn split_version(path: &str) -> Option<((u32, u32), &str)> {
    let rest = path.strip_prefix("/v")?;
    let end = rest.find('/').unwrap_or(rest.len());
    let (ver, tail) = rest.split_at(end);
    let (major, minor) = ver.split_once('.')?;
    let digits = |s: &str| !s.is_empty() && s.len() <= 9 && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(major) && digits(minor)) {
        return None;
    }
    let version = (major.parse().ok()?, minor.parse().ok()?);
    Some((version, if tail.is_empty() { "/" } else { tail }))
}

/// Checks the `/v1.NN` prefix against the versions served (400 with the engine's message outside them) and
/// strips it before routing.
pub(crate) async fn api_version(mut req: Request, next: Next) -> Response {
    if let Some(((major, minor), path)) = split_version(req.uri().path()) {
        let asked = format!("{major}.{minor}");
        if (major, minor) < MIN_API_VERSION {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "client version {asked} is too old. Minimum supported API version is {}.{}, please upgrade your \
                     client to a newer version",
                    MIN_API_VERSION.0, MIN_API_VERSION.1
                ),
            );
        }
        if (major, minor) > MAX_API_VERSION {
            return error(
                StatusCode::BAD_REQUEST,
                format!(
                    "client version {asked} is too new. Maximum supported API version is {}.{}",
                    MAX_API_VERSION.0, MAX_API_VERSION.1
                ),
            );
        }
        let pq = match req.uri().query() {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        let mut parts = req.uri().clone().into_parts();
        if let Ok(p) = pq.parse() {
            parts.path_and_query = Some(p);
            if let Ok(uri) = Uri::from_parts(parts) {
                *req.uri_mut() = uri;
            }
        }
        req.extensions_mut().insert(ApiVersion(major, minor));
    }
    next.run(req).await
}

/// A boolean query parameter as the engine reads one (`httputils.BoolValue`): absent, empty, "0", "no",
/// "false" and "none" (any case, trimmed) are false, anything else is true.
pub fn bool_param(q: &std::collections::HashMap<String, String>, name: &str) -> bool {
    q.get(name).is_some_and(|v| {
        let v = v.trim().to_ascii_lowercase();
        !matches!(v.as_str(), "" | "0" | "no" | "false" | "none")
    })
}

/// A boolean query parameter as the engine reads `status`, `insertDefaults` and the swarm update's `rotate*`
/// flags (Go's `strconv.ParseBool`):
/// absent or empty is false; `1`, `t`, `T`, `TRUE`, `true`, `True` are true; `0`, `f`, `F`, `FALSE`, `false`,
/// `False` are false; anything else is a 400 `invalid value for NAME: VALUE`.
pub fn parse_bool_param(q: &std::collections::HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match q.get(name).map(String::as_str) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(true),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(false),
        Some(v) => Err(ApiError::BadRequest(format!(
            "invalid value for {name}: {v}: expected true or false (1, t, T, TRUE, true, True, 0, f, F, FALSE, false, \
             False)"
        ))),
    }
}

/// Decodes a request body into `T` as the engine does (`httputils.ReadJSON`, then Go's `encoding/json`, see
/// `json::go_decode`): a body needs `Content-Type: application/json`; an empty one is refused here (the engine
/// would decode nothing and fail later on the zero value); `what` names the document in the messages.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
    what: &str,
) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::BadRequest(format!("the request body is empty: send a {what} as JSON")));
    }
    // The engine also refuses a body without a Content-Type; we accept that one (scripts posting with curl
    // and no header get the same answer as with it).
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = String::from_utf8_lossy(ct.as_bytes());
        let media = ct.split(';').next().unwrap_or("").trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return Err(ApiError::BadRequest(format!(
                "unsupported Content-Type header ({ct}): must be 'application/json'"
            )));
        }
    }
    crate::json::decode(body).map_err(|e| ApiError::BadRequest(format!("{e} (in the {what})")))
}

#[cfg(test)]
mod tests {
    use super::split_version;

    #[test]
    fn version_prefixes_split() {
        assert_eq!(split_version("/v1.47/info"), Some(((1, 47), "/info")));
        assert_eq!(split_version("/v1.24"), Some(((1, 24), "/")));
        assert_eq!(split_version("/v1.x/info"), None);
        assert_eq!(split_version("/volumes"), None);
        assert_eq!(split_version("/v99999999999.1/info"), None);
    }
}
