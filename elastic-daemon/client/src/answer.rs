//! A whole answer read into memory, never more than the caller allows: a
//! replica's /metrics or a model list is small, and one that streams
//! without end must not grow onepoold's memory.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;

/// Status, headers and the whole body.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    /// The body as text (lossy: for messages and metrics, never for
    /// data that must round-trip).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; the error names what was wrong with it.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, String> {
        serde_json::from_slice(&self.body).map_err(|e| format!("the answer is not the JSON expected: {e}"))
    }
}

/// Reads `body` whole, or says it is longer than `limit` bytes
/// (`Err(None)`) or broke off (`Err(Some(reason))`).
pub async fn read_bounded<B>(mut body: B, limit: usize) -> Result<Bytes, Option<String>>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::error::Error + 'static,
{
    let mut out = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Some(crate::error::chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(None);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}
