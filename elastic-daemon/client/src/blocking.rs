//! The same client for code that is not async (the cluster tests, the
//! CLI's one-shot calls): each call runs on the client's own one-thread
//! runtime, so a test needs no runtime of its own and no raw socket.
//!
//! Must not be called from inside a tokio runtime (tokio refuses to block
//! a runtime's thread on another runtime); async code uses [`Caller`].

use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};

use crate::{Answer, Caller, ClientError};

pub struct Client {
    runtime: tokio::runtime::Runtime,
    caller: Caller,
}

impl Client {
    /// A client whose every call is answered whole within `timeout`.
    ///
    /// # Panics
    /// When the OS refuses the runtime's thread or timer (nothing else
    /// could run then either).
    pub fn new(timeout: Duration) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a one-thread tokio runtime for the blocking client");
        let caller = {
            let _inside = runtime.enter();
            Caller::tcp(timeout)
        };
        Client { runtime, caller }
    }

    /// `name: value` on every request that does not set it itself.
    #[must_use]
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.caller = self.caller.with_header(name, value);
        self
    }

    pub fn get(&self, uri: &str, limit: usize) -> Result<Answer, ClientError> {
        self.runtime.block_on(self.caller.get(uri, limit))
    }

    pub fn post_json(&self, uri: &str, json: &str, limit: usize) -> Result<Answer, ClientError> {
        self.runtime.block_on(self.caller.post_json(uri, json, limit))
    }

    /// Any request: `body` is sent as JSON, `headers` beside the client's.
    pub fn request(
        &self,
        method: Method,
        uri: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
        limit: usize,
    ) -> Result<Answer, ClientError> {
        let req = self.caller.build(method, uri, body, headers)?;
        self.runtime.block_on(self.caller.send(req, limit))
    }
}
