//! A pooled client with what every one of a caller's requests carries: a
//! bound on the whole exchange and its default headers (onepoold's replica
//! key: launchers answer nothing without it).

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, CONTENT_TYPE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::client::legacy::Client;

use crate::{Answer, ClientError, FullBody};

#[derive(Debug, Clone)]
pub struct Caller<C = HttpConnector> {
    client: Client<C, FullBody>,
    headers: HeaderMap,
    timeout: Duration,
}

impl Caller<HttpConnector> {
    /// A caller on a pooled TCP client whose connect bound is `timeout`
    /// too: a call that may take `timeout` in all should not spend more
    /// than that connecting.
    pub fn tcp(timeout: Duration) -> Self {
        Caller::new(crate::pooled(crate::Settings::with_connect_timeout(timeout)), timeout)
    }
}

impl<C> Caller<C>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    /// Every request through `client` answered whole within `timeout`.
    pub fn new(client: Client<C, FullBody>, timeout: Duration) -> Self {
        Caller { client, headers: HeaderMap::new(), timeout }
    }

    /// `name: value` on every request that does not set it itself.
    pub fn with_header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.insert(name, value);
        self
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `GET uri`, its answer read up to `limit` bytes.
    pub async fn get(&self, uri: &str, limit: usize) -> Result<Answer, ClientError> {
        self.send(self.build(Method::GET, uri, None, &[])?, limit).await
    }

    /// `POST uri` with a JSON body.
    pub async fn post_json(&self, uri: &str, json: &str, limit: usize) -> Result<Answer, ClientError> {
        self.send(self.build(Method::POST, uri, Some(json), &[])?, limit).await
    }

    /// A request with `body` (JSON when there is one) and `headers` beside
    /// the caller's own; the error says which part was malformed.
    pub fn build(
        &self,
        method: Method,
        uri: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> Result<Request<FullBody>, ClientError> {
        let bad = |reason: String| ClientError::Request { method: method.to_string(), uri: uri.to_string(), reason };
        let parsed: Uri = uri.parse().map_err(|e| bad(format!("not a URI: {e}")))?;
        let mut req = Request::builder().method(method.clone()).uri(parsed);
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| bad(format!("header {name:?}: {e}")))?;
            let value = HeaderValue::from_str(value).map_err(|e| bad(format!("header {name}'s value: {e}")))?;
            req = req.header(name, value);
        }
        let body = FullBody::new(body.map(|b| Bytes::copy_from_slice(b.as_bytes())).unwrap_or_default());
        req.body(body).map_err(|e| bad(e.to_string()))
    }

    /// Sends `req` and reads its whole answer up to `limit` bytes, all
    /// within the caller's timeout.
    pub async fn send(&self, req: Request<FullBody>, limit: usize) -> Result<Answer, ClientError> {
        let (method, uri) = (req.method().clone(), req.uri().clone());
        let exchange = async {
            let resp = self.open_unbounded(req).await?;
            let (parts, body) = resp.into_parts();
            let body = crate::read_bounded(body, limit).await.map_err(|e| match e {
                None => ClientError::TooLong { method: method.to_string(), uri: uri.to_string(), limit },
                Some(reason) => ClientError::Exchange {
                    method: method.to_string(),
                    uri: uri.to_string(),
                    reason: format!("reading the answer: {reason}"),
                },
            })?;
            Ok(Answer { status: parts.status, headers: parts.headers, body })
        };
        tokio::time::timeout(self.timeout, exchange).await.unwrap_or_else(|_| {
            Err(ClientError::Timeout { method: method.to_string(), uri: uri.to_string(), after: self.timeout })
        })
    }

    /// Sends `req` and returns as soon as the answer's head is in (within
    /// the timeout); the body is the caller's to read, as it streams (a
    /// load generator timing the first token).
    pub async fn open(&self, req: Request<FullBody>) -> Result<Response<Incoming>, ClientError> {
        let (method, uri) = (req.method().clone(), req.uri().clone());
        tokio::time::timeout(self.timeout, self.open_unbounded(req)).await.unwrap_or_else(|_| {
            Err(ClientError::Timeout { method: method.to_string(), uri: uri.to_string(), after: self.timeout })
        })
    }

    async fn open_unbounded(&self, mut req: Request<FullBody>) -> Result<Response<Incoming>, ClientError> {
        for (name, value) in &self.headers {
            if !req.headers().contains_key(name) {
                req.headers_mut().insert(name, value.clone());
            }
        }
        let (method, uri) = (req.method().clone(), req.uri().clone());
        self.client.request(req).await.map_err(|e| ClientError::from_hyper(&method, &uri, e))
    }
}
