//! The reverse proxy: a listener per endpoint, or a shared listener that
//! picks the endpoint by `Host`, path prefix or the OpenAI `model` field;
//! HTTP/1.1 and HTTP/2 (h2c prior knowledge) from clients, HTTP/1.1 to
//! replicas. Response bodies
//! stream through frame by frame; the replica's lease ends with the last
//! frame (or when the client goes away), so drains wait for streams too.

mod answers;
mod body;
mod body_budget;
mod client_stream;
mod connections;
mod dispatch;
mod graceful;
mod lean;
mod leased;
mod resumable;
mod routes;
mod serve;
mod target;
mod to_replica;
mod watched;
mod whole;

pub use body::ProxyBody;
pub use body_budget::BodyBudget;
pub use routes::{Dispatch, Routed};
pub use serve::serve;
pub use target::Target;
