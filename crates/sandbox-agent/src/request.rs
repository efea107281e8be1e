//! Request decoding shared by the routes: capped JSON bodies, query strings
//! and lenient scalar fields (integer-or-float timeouts, `null` for any
//! optional field).
//!
//! Owns: turning bytes on the wire into typed requests. Must not touch the
//! filesystem or processes.

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::de::DeserializeOwned;

/// Largest JSON request body accepted (uploads are streamed, not capped).
pub const MAX_JSON_BODY: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("reading request body: {0}")]
    ReadBody(String),
    #[error("request body larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("invalid JSON request: {0}")]
    Json(#[from] serde_json::Error),
    #[error("invalid query string: {0}")]
    Query(String),
}

/// Reads at most [`MAX_JSON_BODY`] bytes and decodes them as `T`. Unknown
/// fields are ignored by serde's default; an empty body is `{}`.
pub async fn json_body<T: DeserializeOwned>(body: Incoming) -> Result<T, RequestError> {
    let collected = Limited::new(body, MAX_JSON_BODY)
        .collect()
        .await
        .map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                RequestError::TooLarge {
                    limit: MAX_JSON_BODY,
                }
            } else {
                RequestError::ReadBody(e.to_string())
            }
        })?;
    let bytes = collected.to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(serde_json::from_slice(b"{}")?);
    }
    Ok(serde_json::from_slice(&bytes)?)
}

/// The value of `key` in a query string, form-decoded (`+` is a space).
pub fn query_param(query: Option<&str>, key: &str) -> Result<Option<String>, RequestError> {
    let Some(query) = query else { return Ok(None) };
    for pair in query.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode(k)? == key {
            return Ok(Some(percent_decode(v)?));
        }
    }
    Ok(None)
}

/// Decodes `application/x-www-form-urlencoded` text.
fn percent_decode(s: &str) -> Result<String, RequestError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| RequestError::Query(format!("bad percent escape in {s:?}")))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| RequestError::Query("query is not UTF-8".into()))
}

pub use sandbox_abi::agent_api::lenient;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct T {
        #[serde(default, deserialize_with = "lenient::seconds")]
        t: Option<f64>,
        #[serde(default, deserialize_with = "lenient::flag")]
        b: Option<bool>,
        #[serde(default, deserialize_with = "lenient::int")]
        i: Option<i64>,
    }

    #[test]
    fn lenient_fields_accept_int_float_null_and_missing() {
        let v: T = serde_json::from_str(r#"{"t": 3, "b": null, "i": 2.0, "x": 1}"#).unwrap();
        assert_eq!((v.t, v.b, v.i), (Some(3.0), None, Some(2)));
        let v: T = serde_json::from_str(r#"{"t": 2.5, "b": true}"#).unwrap();
        assert_eq!((v.t, v.b, v.i), (Some(2.5), Some(true), None));
    }

    #[test]
    fn query_params_are_form_decoded() {
        let q = Some("a=1&path=%2Ftmp%2Fa+b%2Bc.txt");
        assert_eq!(query_param(q, "path").unwrap().unwrap(), "/tmp/a b+c.txt");
        assert_eq!(query_param(q, "nope").unwrap(), None);
        assert!(query_param(Some("path=%zz"), "path").is_err());
    }
}
