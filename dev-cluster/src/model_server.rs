//! The real model server that the demo, the serving tests and the serving
//! benchmarks put behind onepoold: llama.cpp's `llama-server` with
//! SmolLM2-135M-Instruct, both made once per machine by
//! scripts/model-server.sh (from PyPI, pinned), which also binds them into
//! the release roots at the same path.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The name replicas serve the model under (`--alias`): what `/v1/models`
/// lists and what clients put in `"model"`.
pub const MODEL_NAME: &str = "SmolLM2-135M-Instruct";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const DEFAULT_DIR: &str = "/var/cache/onepool/model-server";

/// Where scripts/model-server.sh put the server and the model.
#[derive(Clone, Debug)]
pub struct ModelServer {
    dir: PathBuf,
}

/// How one replica's server runs.
#[derive(Clone, Copy, Debug)]
pub struct Slots {
    /// Requests the server decodes at once (`--parallel`); the endpoint's
    /// replica_concurrency should be the same, so that requests wait in
    /// onepoold's queue, where the autoscaler sees them, not in the server.
    pub parallel: u32,
    /// Context tokens per request (prompt and answer together).
    pub context: u32,
    /// CPU threads for the model (`-t`).
    pub threads: u32,
}

impl ModelServer {
    /// `$ONEPOOL_MODEL_SERVER_DIR`, else /var/cache/onepool/model-server;
    /// fails with the command that makes it when the files are missing.
    pub fn locate() -> Result<ModelServer> {
        let dir = std::env::var_os("ONEPOOL_MODEL_SERVER_DIR").map(PathBuf::from).unwrap_or_else(|| DEFAULT_DIR.into());
        Self::at(&dir)
    }

    pub fn at(dir: &Path) -> Result<ModelServer> {
        let s = ModelServer { dir: dir.to_path_buf() };
        for f in [s.binary(), s.model()] {
            if !f.is_file() {
                return Err(Error::Setup(format!(
                    "{} is missing: make the model server with `bash scripts/model-server.sh` (it builds llama-server and unpacks the model once)",
                    f.display()
                )));
            }
        }
        Ok(s)
    }

    pub fn binary(&self) -> PathBuf {
        self.dir.join("bin/llama-server")
    }

    pub fn model(&self) -> PathBuf {
        self.dir.join("models").join(MODEL_FILE)
    }

    /// The argument list of a server on `port` (127.0.0.1 only).
    pub fn args(&self, port: &str, slots: Slots) -> Vec<String> {
        let n = |v: u32| v.to_string();
        [
            "-m",
            &self.model().display().to_string(),
            "--alias",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            port,
            "-t",
            &n(slots.threads),
            "--parallel",
            &n(slots.parallel),
            // llama-server splits -c among the slots.
            "-c",
            &n(slots.context * slots.parallel),
            // /metrics, for load_metrics.
            "--metrics",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// The replica command for onepoold's `[endpoint.replicas] command`:
    /// the shell `onepool replica` starts expands $ONEPOOL_BACKEND_PORT.
    pub fn replica_command(&self, slots: Slots) -> String {
        let args = self.args("$ONEPOOL_BACKEND_PORT", slots).join(" ");
        format!("sh -c 'exec {} {args}'", self.binary().display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replica_command_expands_the_port_in_the_launchers_shell() {
        let dir = std::env::temp_dir().join(format!("onepool-model-server-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::create_dir_all(dir.join("models")).unwrap();
        assert!(ModelServer::at(&dir).unwrap_err().to_string().contains("bin/llama-server is missing"));
        std::fs::write(dir.join("bin/llama-server"), "").unwrap();
        std::fs::write(dir.join("models").join(MODEL_FILE), "").unwrap();
        let s = ModelServer::at(&dir).unwrap();
        let c = s.replica_command(Slots { parallel: 4, context: 512, threads: 1 });
        let d = dir.display();
        assert_eq!(
            c,
            format!("sh -c 'exec {d}/bin/llama-server -m {d}/models/{MODEL_FILE} --alias {MODEL_NAME} --host 127.0.0.1 --port $ONEPOOL_BACKEND_PORT -t 1 --parallel 4 -c 2048 --metrics'")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
