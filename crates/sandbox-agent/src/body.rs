//! The body type of every response the agent sends, shared by the
//! envelope (JSON responses) and the streamed downloads of `transfer`.
//!
//! Owns: [`AgentBody`] and [`full`]. Must not know about routes, errors or
//! response shapes.

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// The body type of every response the agent sends.
pub type AgentBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// A body from bytes already in memory.
pub fn full(bytes: Bytes) -> AgentBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}
