//! [`Control`](crate::Control) for callers that are not async (`onepool
//! status`, the cluster tests): each call on the client's own one-thread
//! runtime. Must not be called from inside a tokio runtime.

use std::path::PathBuf;
use std::time::Duration;

use crate::{api, ControlError};

pub struct Control {
    runtime: tokio::runtime::Runtime,
    inner: crate::Control,
}

impl Control {
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Result<Self, ControlError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ControlError::Http(format!("a runtime for the control client: {e}")))?;
        let inner = {
            let _inside = runtime.enter();
            crate::Control::new(socket, timeout)
        };
        Ok(Control { runtime, inner })
    }

    pub fn state(&self) -> Result<api::State, ControlError> {
        self.runtime.block_on(self.inner.state())
    }

    pub fn add_replica(&self, endpoint: &str, add: &api::AddReplica) -> Result<api::Added, ControlError> {
        self.runtime.block_on(self.inner.add_replica(endpoint, add))
    }

    pub fn retry(&self, endpoint: &str) -> Result<api::RetryAccepted, ControlError> {
        self.runtime.block_on(self.inner.retry(endpoint))
    }
}
