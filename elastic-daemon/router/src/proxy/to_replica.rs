//! A request on its way to a replica and back: the head made once for
//! every attempt, a replica per attempt (by prefix when the endpoint routes
//! so), retries on another replica, hop-by-hop headers kept off both ways.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use onepool_launcher::conventions::{DRAINING_HEADER, MOVABLE_HEADER, SERVER_FAILED_HEADER};

use crate::access_log::{Refused, RequestFacts, ServedBy, Tap};
use crate::backend_pool::{self, BackendBody, SendError, HOP_BY_HOP};
use crate::classes::CLASS_HEADER;
use crate::endpoint::{AcquireError, Lease, Rank, Want};
use crate::metrics::{ClassEvent, Retry, Unavailable};
use crate::prefix::prefix_key;
use crate::proxy::answers::{is_safe, logged, openai_error, unavailable};
use crate::proxy::body::{BodyKind, ProxyBody};
use crate::proxy::connections::ClientConn;
use crate::proxy::leased::LeasedBody;
use crate::proxy::resumable::{MoveContext, Resumable, ResumableBody};
use crate::proxy::target::Target;
use crate::registry::ReplicaId;
use crate::resume::plan::Followed;
use crate::settings::MODEL_PATHS;

pub(super) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// The request as it goes to a replica: origin-form target, HTTP/1.1,
/// hop-by-hop headers left out, `X-Forwarded-For` extended, the body whole
/// with its length. Its head is serialized once for every attempt, from
/// the client's header map as it is (the map then takes the response's
/// headers: see `backend_pool::send`).
pub(super) struct Forwarded {
    pub(super) method: Method,
    pub(super) uri: Uri,
    pub(super) headers: HeaderMap,
    pub(super) body: Bytes,
    /// The client's host from HTTP/2's :authority, for want of a Host header.
    pub(super) authority: Option<HeaderValue>,
    pub(super) forwarded_for: HeaderValue,
    /// The client sent a Content-Length (so an empty body says "0").
    pub(super) had_length: bool,
    /// The client named no host: each attempt names its replica.
    pub(super) host_from_replica: bool,
    /// Hop-by-hop fields to leave out (those `Connection` names); only
    /// looked at when `hop_by_hop`.
    pub(super) connection_names: Vec<HeaderName>,
    pub(super) hop_by_hop: bool,
    /// onepoold's replica key for the replica (a client's own
    /// `x-onepool-replica-key` never passes).
    pub(super) replica_key: Option<HeaderValue>,
    /// The client's `Authorization` stays with the router
    /// ([`ProxySettings::client_authorization_passes`]).
    pub(super) drop_authorization: bool,
    /// The router can continue the answer elsewhere: the launcher may move
    /// it rather than wait for it ([`onepool_launcher::conventions::MOVABLE_HEADER`]).
    pub(super) movable: bool,
}

impl Forwarded {
    pub(super) fn new(parts: http::request::Parts, body: Bytes, client: &ClientConn) -> Forwarded {
        let http::request::Parts { method, uri, headers, .. } = parts;
        // One look at each field instead of a look-up per name.
        let (mut hop_by_hop, mut has_host, mut had_length, mut prev_forwarded) = (false, false, false, None);
        for (name, value) in &headers {
            if name == header::HOST {
                has_host = true;
            } else if name == header::CONTENT_LENGTH {
                had_length = true;
            } else if name == X_FORWARDED_FOR {
                prev_forwarded = prev_forwarded.or(Some(value));
            } else if is_hop_by_hop(name) {
                hop_by_hop = true;
            }
        }
        let connection_names = if hop_by_hop { connection_names(&headers) } else { Vec::new() };
        // HTTP/2 clients name the host in :authority, not in a Host header.
        let authority = match has_host {
            true => None,
            false => uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()),
        };
        let host_from_replica = authority.is_none() && !has_host;
        let forwarded_for = match prev_forwarded.and_then(|v| v.to_str().ok()) {
            Some(prev) => {
                let ip = client.forwarded_for.to_str().unwrap_or_default();
                HeaderValue::from_str(&format!("{prev}, {ip}")).unwrap_or_else(|_| client.forwarded_for.clone())
            }
            None => client.forwarded_for.clone(),
        };
        Forwarded {
            method,
            uri,
            headers,
            body,
            authority,
            forwarded_for,
            had_length,
            host_from_replica,
            connection_names,
            hop_by_hop,
            replica_key: None,
            drop_authorization: false,
            movable: false,
        }
    }

    /// Whether a client header field goes to the replica as it is.
    pub(super) fn passes(&self, name: &HeaderName) -> bool {
        name != header::CONTENT_LENGTH
            && name != X_FORWARDED_FOR
            && !is_onepool_field(name.as_str().as_bytes())
            && !(self.drop_authorization && name == header::AUTHORIZATION)
            && !(self.hop_by_hop && (is_hop_by_hop(name) || self.connection_names.contains(name)))
    }

    /// The request line and header section, naming `host` if the client
    /// named none, for a body of `body_len` bytes.
    pub(super) fn head(&self, host: Option<&str>, body_len: usize) -> Vec<u8> {
        let target = self.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let target = if target.is_empty() { "/" } else { target };
        let method = self.method.as_str();
        let fields: usize = self.headers.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum();
        let mut b = Vec::new();
        let mut w = HeadWriter::new(&mut b, method.len() + target.len() + fields + self.forwarded_for.len() + 96);
        w.request_line(method, target);
        match (&self.authority, host) {
            (Some(a), _) => w.field(b"host", a.as_bytes()),
            (None, Some(h)) => w.field(b"host", h.as_bytes()),
            (None, None) => {}
        }
        for (name, value) in &self.headers {
            if self.passes(name) {
                w.field(name.as_str().as_bytes(), value.as_bytes());
            }
        }
        w.field(b"x-forwarded-for", self.forwarded_for.as_bytes());
        if let Some(k) = &self.replica_key {
            w.field(crate::REPLICA_KEY_HEADER.as_str().as_bytes(), k.as_bytes());
        }
        if self.movable {
            w.field(MOVABLE_HEADER.as_bytes(), b"1");
        }
        if body_len > 0 || self.had_length {
            w.field(b"content-length", body_len.to_string().as_bytes());
        }
        w.end();
        b
    }
}

/// A field of onepool's own (`x-onepool-*`: the replica key, the movable
/// mark): only the router sets them, a client's never pass.
pub(super) fn is_onepool_field(name: &[u8]) -> bool {
    name.len() >= 10 && name[..10].eq_ignore_ascii_case(b"x-onepool-")
}

/// Writes an HTTP/1.1 head into a buffer (a replica's request head, or
/// the lean path's answer head).
pub(super) struct HeadWriter<'a>(&'a mut Vec<u8>);

impl<'a> HeadWriter<'a> {
    pub(super) fn new(b: &'a mut Vec<u8>, size: usize) -> HeadWriter<'a> {
        b.clear();
        b.reserve(size);
        HeadWriter(b)
    }

    pub(super) fn request_line(&mut self, method: &str, target: &str) {
        self.0.extend_from_slice(method.as_bytes());
        self.0.push(b' ');
        self.0.extend_from_slice(target.as_bytes());
        self.0.extend_from_slice(b" HTTP/1.1\r\n");
    }

    pub(super) fn status_line(&mut self, status: StatusCode) {
        self.0.extend_from_slice(b"HTTP/1.1 ");
        self.0.extend_from_slice(status.as_str().as_bytes());
        self.0.push(b' ');
        self.0.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        self.0.extend_from_slice(b"\r\n");
    }

    pub(super) fn field(&mut self, name: &[u8], value: &[u8]) {
        self.field_parts(name, &[value]);
    }

    pub(super) fn field_parts(&mut self, name: &[u8], value: &[&[u8]]) {
        self.0.extend_from_slice(name);
        self.0.extend_from_slice(b": ");
        for v in value {
            self.0.extend_from_slice(v);
        }
        self.0.extend_from_slice(b"\r\n");
    }

    pub(super) fn end(&mut self) {
        self.0.extend_from_slice(b"\r\n");
    }
}

/// Why an attempt got no answer to pass on, for the answer once no
/// attempt is left.
#[derive(Clone, Copy)]
pub(super) enum Failure {
    /// 502: no connection, or the exchange failed.
    Replica,
    /// 503: the replica said it drains.
    Draining,
}

/// A request ready for its attempts.
pub(super) struct Prepared {
    /// The head for every attempt (empty with `per_replica`).
    pub(super) head: Vec<u8>,
    pub(super) body: Bytes,
    /// A header map for the response head.
    pub(super) spare: HeaderMap,
    /// The request, kept (boxed: the future is moved around whole) only
    /// when each attempt names its replica as the host.
    pub(super) per_replica: Option<Box<Forwarded>>,
    pub(super) head_request: bool,
    pub(super) retry_any: bool,
    /// A generation request of the OpenAI API ([`is_generation`]): its
    /// event stream, when the router does not follow it, is watched for
    /// an early end ([`super::watched`]).
    pub(super) generation: bool,
    /// When the request came (its latency counts from there).
    pub(super) start: Instant,
    /// `start` is as good as now for the first attempt's deadline (one
    /// clock reading less).
    pub(super) start_is_now: bool,
    /// A generation the router can continue elsewhere (boxed: most
    /// requests have none).
    pub(super) resumable: Option<Box<Resumable>>,
    /// Its request class (issue #44), on an endpoint that has classes; or
    /// why the class it asked for was refused.
    pub(super) class: Option<Box<Result<crate::classes::Class, String>>>,
    /// Its API key's line in the tokens file, with classes (0: none): the
    /// keys of a class take turns in the queue.
    pub(super) key: u32,
    /// A generation request on an endpoint with resumption: whether its
    /// answer is followed (`yes`) or why not (issue #51 item 6).
    pub(super) followed: Option<Followed>,
}

impl Prepared {
    /// Its request class, when the endpoint has classes and took it.
    fn class(&self) -> Option<&crate::classes::Class> {
        self.class.as_deref().and_then(|c| c.as_ref().ok())
    }
}

impl Prepared {
    pub(super) fn new(
        parts: http::request::Parts,
        body: Bytes,
        ctx: &Target,
        client: &ClientConn,
        start: Instant,
    ) -> Prepared {
        let generation = is_generation(&parts.method, parts.uri.path());
        let retry_any = ctx.settings.idempotent || is_safe(&parts.method) || generation;
        let mut out = Forwarded::new(parts, body, client);
        out.replica_key = ctx.endpoint.replica_key().cloned();
        out.drop_authorization = !ctx.settings.client_authorization_passes();
        let mut key = 0;
        let class = match ctx.settings.classes.as_ref() {
            Some(c) => {
                let keyed = ctx.settings.auth.as_ref().and_then(|a| a.key_of(&out.headers));
                key = keyed.map_or(0, |(k, _)| k);
                Some(Box::new(c.of(keyed.and_then(|(_, class)| class), &out.headers)))
            }
            // A class asked of an endpoint that has none is refused, not
            // ignored: the client would believe it was served in it (and
            // one naming a higher class would leave no trace, issue #50).
            None => out.headers.get(CLASS_HEADER).map(|_| Box::new(Err(no_classes()))),
        };
        if generation && out.method == Method::POST {
            engine_priority(ctx, &mut out, class.as_deref().and_then(|c| c.as_ref().ok()));
        }
        // A followed answer is a generation's: retried before its head.
        let (resumable, followed) = resumable(ctx, &mut out, class.as_deref().and_then(|c| c.as_ref().ok()));
        let head_request = out.method == Method::HEAD;
        let head = if out.host_from_replica { Vec::new() } else { out.head(None, out.body.len()) };
        // Serialized, the client's header map takes the response's fields:
        // no map is made or freed per request (hyper reuses the response's
        // map for the next request on the connection).
        let spare = if out.host_from_replica { HeaderMap::new() } else { std::mem::take(&mut out.headers) };
        let body = std::mem::take(&mut out.body);
        let per_replica = out.host_from_replica.then(|| Box::new(out));
        Prepared {
            head,
            body,
            spare,
            per_replica,
            head_request,
            retry_any,
            generation,
            start,
            start_is_now: false,
            resumable,
            class,
            key,
            followed,
        }
    }
}

/// The request's `priority` set to its class's value on an endpoint that
/// tells its engine (issue #51 item 3), before anything else reads the
/// body: a continued answer keeps it. A body that is no JSON object goes
/// as it came (the engine refuses it).
fn engine_priority(ctx: &Target, out: &mut Forwarded, class: Option<&crate::classes::Class>) {
    let Some(class) = class else { return };
    let Some(p) = ctx.settings.classes.as_ref().and_then(|c| c.engine_priority()) else { return };
    let Some(value) = p.value(class.rank) else { return };
    if let Some(body) = crate::prompt_scan::set_member(&out.body, b"priority", value.as_bytes()) {
        out.body = Bytes::from(body);
    }
}

fn no_classes() -> String {
    format!(
        "{CLASS_HEADER}: this endpoint serves its requests in one class (none of its API keys names a class and it sets no request_class), so it takes no class from a request"
    )
}

/// Whether the router can continue the request's answer elsewhere
/// ([`crate::resume`]); if so, its first attempt asks for what that takes.
/// A lower class's whole answers are streamed from the engine, so that
/// they too can yield their slot (issue #44).
/// Also whether its answer is followed (`yes`) or why not, for a
/// generation request on an endpoint with resumption (issue #51 item 6).
fn resumable(
    ctx: &Target,
    out: &mut Forwarded,
    class: Option<&crate::classes::Class>,
) -> (Option<Box<Resumable>>, Option<Followed>) {
    let Some(settings) = ctx.settings.resume else { return (None, None) };
    if out.method != Method::POST {
        return (None, None);
    }
    let whole_as_stream = class.is_some_and(|c| c.lower);
    // A whole answer is sent again whole, whatever its shape: what it asks
    // for needs no reading (issue #51 item 5: the chat POST paid a parse
    // of its whole body for nothing). It is movable: a draining replica
    // answers it "draining" before it starts, and it goes elsewhere.
    if !whole_as_stream && crate::resume::plan::asks_whole(out.uri.path(), &out.body) {
        out.movable = true;
        return (None, Some(Followed::Whole));
    }
    match crate::resume::plan::Plan::of(out.uri.path(), &out.body, settings.method, whole_as_stream, settings.seed) {
        Ok(Some(crate::resume::plan::Planned { plan, first })) => {
            let followed = match (plan.stream, plan.replay_only) {
                (false, _) => Followed::Whole,
                (true, true) => Followed::Replay,
                (true, false) => Followed::Yes,
            };
            let client = out.body.clone();
            if let Some(first) = first {
                out.body = Bytes::from(first);
            }
            out.movable = true;
            let authorization = match out.drop_authorization {
                true => None,
                false => out.headers.get(header::AUTHORIZATION).cloned(),
            };
            let sent = out.body.clone();
            let r = Resumable { plan, client, sent, authorization, class: class.cloned() };
            (Some(Box::new(r)), Some(followed))
        }
        Ok(None) => (None, None),
        Err(why) => {
            tracing::debug!(endpoint = %ctx.endpoint.name(), ?why, "this answer cannot be continued elsewhere");
            (None, Some(Followed::Not(why)))
        }
    }
}

impl Prepared {
    /// A request read by the lean HTTP/1.1 path, its replica's head
    /// already written; its clock starts now (its head was just parsed).
    pub(super) fn lean(
        head: Vec<u8>,
        body: Bytes,
        spare: HeaderMap,
        head_request: bool,
        (retry_any, generation, whole): (bool, bool, bool),
    ) -> Prepared {
        let start = Instant::now();
        let (resumable, class) = (None, None);
        let followed = whole.then_some(Followed::Whole);
        Prepared {
            head,
            body,
            spare,
            per_replica: None,
            head_request,
            retry_any,
            generation,
            start,
            start_is_now: true,
            resumable,
            class,
            key: 0,
            followed,
        }
    }
}

/// [`forward_to`] a replica, and with the access log on, its line.
pub(super) async fn forward(p: Prepared, ctx: &Target) -> Response<ProxyBody> {
    let class = match p.class.as_deref() {
        Some(Err(why)) => {
            ctx.endpoint.count_answer(400);
            let facts = RequestFacts::of(p.resumable.as_ref().map_or(&p.body, |r| &r.client));
            return logged(ctx, p.start, facts, "class_refused", openai_error(StatusCode::BAD_REQUEST, why));
        }
        Some(Ok(c)) => Some(c.name.clone()),
        None => None,
    };
    if let Some(c) = &class {
        ctx.metrics.count_class(ctx.endpoint.name(), c, ClassEvent::Request);
    }
    if let Some(f) = p.followed {
        ctx.endpoint.note_followed(class.as_deref().unwrap_or(""), f.as_str());
    }
    let Some(log) = &ctx.access else { return forward_to(p, ctx).await };
    // What the client asked for: a followed answer's body to the engine
    // is rewritten (streamed, with token ids).
    let facts = RequestFacts::of(p.resumable.as_ref().map_or(&p.body, |r| &r.client));
    let (start, followed) = (p.start, p.followed);
    // Boxed: the log's state would otherwise grow every request's future.
    let mut r = Box::pin(forward_to(p, ctx)).await;
    let replica = r.extensions().get::<ServedBy>().map(|s| s.0);
    let mut tap = Tap::new(log.clone(), ctx.endpoint.name(), facts, start, r.status().as_u16(), replica);
    tap.class = class.map(|c| c.to_string());
    tap.reason = r.extensions().get::<Refused>().map(|w| w.0);
    tap.followed = followed.map(Followed::as_str);
    if let Some(m) = r.extensions().get::<super::whole::Moves>() {
        tap.moved = m.0;
    }
    if r.body().is_end_stream() {
        // No frame will pass (an empty answer): whole as it is.
        tap.end(true);
    }
    r.body_mut().tap = Some(Box::new(tap));
    r
}

/// The answer when no attempt is left after `f`.
fn failed(ctx: &Target, f: Failure) -> Response<ProxyBody> {
    match f {
        Failure::Replica => {
            refused(openai_error(StatusCode::BAD_GATEWAY, "the replica failed before answering"), "replica_failed")
        }
        Failure::Draining => {
            ctx.endpoint.count_unavailable(Unavailable::Draining);
            let r = unavailable(ctx, "the replica is draining and no other one could take the request");
            refused(r, "draining")
        }
    }
}

/// `r`, marked for the access log as the router's own answer, for `why`.
fn refused(mut r: Response<ProxyBody>, why: &'static str) -> Response<ProxyBody> {
    r.extensions_mut().insert(Refused(why));
    r
}

/// A slot for the request, at its class's place in the queue (issue #44).
async fn acquire(ctx: &Target, p: &Prepared, tried: &[ReplicaId], prefix: &[u64]) -> Result<Lease, AcquireError> {
    let (rank, lower) = p.class().map_or((Rank::default(), false), |c| (c.rank, c.lower));
    let want = Want { exclude: tried, prefix, rank, lower, key: p.key, ..Want::default() };
    let lease = ctx.endpoint.acquire_want(want).await?;
    if let Some(c) = p.class() {
        ctx.metrics.observe_class_wait(ctx.endpoint.name(), &c.name, lease.queued().as_secs_f64());
    }
    Ok(lease)
}

/// The answer when no replica could be had: why the last attempt failed,
/// else why none was free.
fn no_replica(ctx: &Target, last_failure: Option<Failure>, e: AcquireError, p: &Prepared) -> Response<ProxyBody> {
    if let (AcquireError::ClassFull | AcquireError::QueueFull | AcquireError::KeyFull, Some(c)) = (e, p.class()) {
        ctx.metrics.count_class(ctx.endpoint.name(), &c.name, ClassEvent::Shed);
    }
    let r = match (last_failure, e) {
        (Some(f), _) => failed(ctx, f),
        (None, AcquireError::QueueFull) => {
            ctx.endpoint.count_unavailable(Unavailable::QueueFull);
            refused(unavailable(ctx, "every replica is busy and the queue is full; retry later"), "queue_full")
        }
        (None, AcquireError::TimedOut) => {
            ctx.endpoint.count_unavailable(Unavailable::QueueTimeout);
            refused(unavailable(ctx, "no replica became free in time; retry later"), "queue_timeout")
        }
        (None, AcquireError::ClassFull) => shed(
            ctx,
            p,
            "this request class's share of the endpoint's queue is full; requests of higher classes go first, retry later",
            "class_full",
        ),
        (None, AcquireError::KeyFull) => shed(
            ctx,
            p,
            "this API key holds its share of its request class's queue while other keys of the class wait; retry after the time Retry-After says",
            "key_full",
        ),
    };
    ctx.endpoint.count_answer(r.status().as_u16());
    r
}

/// 429 for a request its class's queue has no place for: `Retry-After` is
/// how long the request would wait if it came back now (its key's turns
/// at the pace its class is served, issue #51).
fn shed(ctx: &Target, p: &Prepared, message: &str, why: &'static str) -> Response<ProxyBody> {
    let mut r = openai_error(StatusCode::TOO_MANY_REQUESTS, message);
    let rank = p.class().map(|c| c.rank).unwrap_or_default();
    let wait = ctx.endpoint.expected_wait(rank, p.key);
    // Whole seconds, rounded up: a client never comes back too early.
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    refused(r, why)
}

/// One attempt's exchange up to the response head. A lost replica's
/// answer will not come (a node cut off the network): the request goes
/// elsewhere then rather than at request_timeout, its client none the
/// wiser ([`crate::reach`]).
async fn send_unless_lost(
    replica: &crate::endpoint::ReplicaShared,
    connect_timeout: Duration,
    deadline: tokio::time::Instant,
    request: backend_pool::Outgoing<'_>,
) -> Result<Response<backend_pool::BackendBody>, SendError> {
    let send = backend_pool::send(&replica.conns, replica.address, connect_timeout, deadline, request);
    let sent = tokio::select! {
        biased;
        sent = send => sent,
        () = replica.reach.lost() => Err(SendError::Lost),
    };
    match sent {
        // The launcher's model server failed it before any answer: no
        // answer of the server's, a failed exchange like a reset one.
        Ok(resp) if server_failed(&resp) => {
            Err(SendError::Failed("the model server failed the request before answering it".into()))
        }
        sent => sent,
    }
}

impl Retry {
    /// Why a failed attempt is tried again elsewhere.
    fn after(e: &SendError) -> Retry {
        match e {
            SendError::Lost => Retry::Lost,
            SendError::NotSent(_) => Retry::NotSent,
            _ => Retry::Failed,
        }
    }
}

pub(super) async fn forward_to(mut p: Prepared, ctx: &Target) -> Response<ProxyBody> {
    let name = ctx.endpoint.name();
    let mut tried = Vec::new();
    let mut last_failure = None;
    // Read once: every attempt routes by the same prompt.
    let prefix = ctx.settings.prefix.map(|s| prefix_key(&p.body, s.block_bytes)).unwrap_or_default();
    let mut retry: Option<Retry> = None;
    for attempt in 0..=ctx.settings.retries {
        if let Some(why) = retry.take() {
            ctx.endpoint.metrics().count_retry(name, why);
        }
        let lease = match acquire(ctx, &p, &tried, &prefix).await {
            Ok(l) => l,
            Err(e) => return no_replica(ctx, last_failure, e, &p),
        };
        let replica = lease.replica();
        let own_head;
        let head = match &p.per_replica {
            Some(out) => {
                own_head = out.head(Some(&replica.address.to_string()), p.body.len());
                &own_head
            }
            None => &p.head,
        };
        let attempt_start = match attempt == 0 && p.start_is_now {
            true => tokio::time::Instant::from_std(p.start),
            false => tokio::time::Instant::now(),
        };
        let deadline = attempt_start + ctx.settings.request_timeout;
        let request = backend_pool::Outgoing {
            head,
            body: &p.body,
            head_request: p.head_request,
            headers: &mut p.spare,
            body_idle_timeout: ctx.settings.response_idle_timeout,
        };
        let sent = send_unless_lost(replica, ctx.settings.connect_timeout, deadline, request).await;
        let counted = |status: u16| replica.metrics.requests.count(status);
        match sent {
            Err(SendError::TimedOut) => {
                // Not retried: the replica may still be working on it, and a
                // second attempt would double the wait.
                counted(504);
                let r = openai_error(StatusCode::GATEWAY_TIMEOUT, "the replica did not answer in time");
                return refused(r, "replica_timeout");
            }
            Err(e) => {
                let replica = replica.address;
                let not_sent = matches!(e, SendError::NotSent(_) | SendError::Lost);
                tracing::info!(endpoint = %name, %replica, not_sent, "replica request failed: {e}");
                counted(502);
                ctx.endpoint.exchange_failed(lease.id());
                if not_sent || p.retry_any {
                    retry = Some(Retry::after(&e));
                    tried.push(lease.id());
                    last_failure = Some(Failure::Replica);
                    continue;
                }
                return failed(ctx, Failure::Replica);
            }
            Ok(resp) => {
                let id = lease.id();
                match on_head(resp, lease, &mut p, ctx).await {
                    Ok(r) => return r,
                    Err((why, failure)) => {
                        retry = Some(why);
                        tried.push(id);
                        last_failure = Some(failure);
                    }
                }
            }
        }
    }
    let r = failed(ctx, last_failure.unwrap_or(Failure::Replica));
    ctx.endpoint.count_answer(r.status().as_u16());
    r
}

/// An attempt's answer head: a draining replica's is tried elsewhere; a
/// whole answer is read to its end before its head goes out (issue #50),
/// and one its replica cuts short reached no client, so it goes whole to
/// another replica; any other passes on. `Err`: nothing reached the
/// client, try another replica for this reason.
async fn on_head(
    resp: Response<BackendBody>,
    lease: Lease,
    p: &mut Prepared,
    ctx: &Target,
) -> Result<Response<ProxyBody>, (Retry, Failure)> {
    let counted = |status: u16| lease.replica().metrics.requests.count(status);
    if resp.status() == StatusCode::SERVICE_UNAVAILABLE
        && resp.headers().get(DRAINING_HEADER).is_some_and(|v| v.as_bytes() == b"1")
    {
        ctx.endpoint.backend_draining(lease.id());
        counted(503);
        return Err((Retry::Draining, Failure::Draining));
    }
    if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
        ctx.endpoint.count_unavailable(Unavailable::Replica);
    }
    counted(resp.status().as_u16());
    if !whole_before_head(p, &resp) {
        return Ok(answered(resp, lease, p, ctx).await);
    }
    match read_whole_answer(resp).await {
        Ok(whole) => Ok(whole_response(whole, lease, p.start, ctx)),
        Err(e) => {
            let (endpoint, replica) = (ctx.endpoint.name(), lease.address());
            tracing::info!(%endpoint, %replica, "a whole answer was cut short: {e}");
            ctx.endpoint.exchange_failed(lease.id());
            Err((Retry::Failed, Failure::Replica))
        }
    }
}

/// A generation (or embedding) request of the OpenAI API: nothing but
/// compute happens on its way, so one that got no answer head may go whole
/// to another replica whatever failed (issue #50), as a safe method does.
pub(super) fn is_generation(method: &Method, path: &str) -> bool {
    *method == Method::POST && is_generation_path(path)
}

/// A path of the OpenAI API's generation (and embedding) requests; a
/// request target's query is not part of it.
pub(super) fn is_generation_path(target: &str) -> bool {
    MODEL_PATHS.contains(&target.split('?').next().unwrap_or(target))
}

/// The launcher's mark of a request its model server failed before
/// answering ([`SERVER_FAILED_HEADER`]).
fn server_failed(resp: &Response<BackendBody>) -> bool {
    resp.status() == StatusCode::BAD_GATEWAY
        && resp.headers().get(SERVER_FAILED_HEADER).is_some_and(|v| v.as_bytes() == b"1")
}

pub(super) fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// The fields a `Connection` header names (hop-by-hop too).
pub(super) fn connection_names(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect()
}

/// Hop-by-hop headers (RFC 9110 7.6.1) belong to one connection and are not
/// forwarded; HTTP/2 refuses them outright.
pub(super) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages have none: one look at each name, nothing removed.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    for n in connection_names(headers) {
        headers.remove(n);
    }
    for n in &HOP_BY_HOP {
        headers.remove(n);
    }
}

/// Largest whole answer read to its end before its head goes out; a
/// larger one passes as it comes.
const MAX_WHOLE_BEFORE_HEAD: u64 = 16 << 20;

/// Whether `resp` is a whole (not streamed) answer to a generation request
/// the router does not follow, of a known length it reads before passing
/// the head: a replica that dies writing it then leaves no client with a
/// part of it (issue #50).
fn whole_before_head(p: &Prepared, resp: &Response<BackendBody>) -> bool {
    let followed = p.resumable.as_ref().is_some_and(|r| r.plan.stream);
    let length = resp.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    p.generation
        && !followed
        && resp.status().is_success()
        && !is_event_stream(resp.headers())
        && length.is_some_and(|n| n <= MAX_WHOLE_BEFORE_HEAD)
}

/// The answer's body, read whole (its length is bounded by the caller).
async fn read_whole_answer(resp: Response<BackendBody>) -> Result<(Response<Bytes>, bool), String> {
    let (parts, body) = resp.into_parts();
    let hop_by_hop = body.hop_by_hop();
    let whole = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok((Response::from_parts(parts, whole), hop_by_hop))
}

/// A whole answer read before its head: its replica's part is over (the
/// lease goes with this call, its latency counted).
fn whole_response(
    (resp, hop_by_hop): (Response<Bytes>, bool),
    lease: Lease,
    start: Instant,
    ctx: &Target,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    if hop_by_hop {
        strip_hop_by_hop(&mut parts.headers);
    }
    if ctx.access.is_some() {
        parts.extensions.insert(ServedBy(lease.replica().address));
    }
    let took = start.elapsed();
    lease.first_byte(took);
    lease.replica().metrics.latency.observe(took.as_secs_f64());
    Response::from_parts(parts, ProxyBody { kind: BodyKind::Own(Full::new(body)), hold: None, tap: None })
}

/// [`answer`], read to its end first when its client asked for it whole
/// and the router streams it ([`super::whole`]).
async fn answered(resp: Response<BackendBody>, lease: Lease, p: &mut Prepared, ctx: &Target) -> Response<ProxyBody> {
    let whole = p.resumable.as_ref().filter(|r| r.plan.whole).map(|r| r.plan.api);
    let r = answer(resp, lease, p, ctx);
    match whole {
        Some(api) => super::whole::whole_answer(r, api).await,
        None => r,
    }
}

/// The replica's answer on its way to the client: followed, when the
/// router can continue it elsewhere, else passed as it comes.
fn answer(resp: Response<BackendBody>, lease: Lease, p: &mut Prepared, ctx: &Target) -> Response<ProxyBody> {
    if let (Some(r), Some(moves)) = (p.resumable.take(), &ctx.moves) {
        if r.plan.stream && resp.status() == StatusCode::OK && is_event_stream(resp.headers()) {
            return resumable_response(resp, lease, p.start, ctx.access.is_some(), moves.clone(), *r);
        }
    }
    if p.generation && is_event_stream(resp.headers()) {
        return watched_response(resp, lease, p.start, ctx);
    }
    client_response(resp, lease, p.start, ctx.access.is_some())
}

/// [`client_response`] for an event stream the router passes without
/// following it: watched for an early end (issue #50).
fn watched_response(resp: Response<BackendBody>, lease: Lease, start: Instant, ctx: &Target) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    if body.hop_by_hop() {
        strip_hop_by_hop(&mut parts.headers);
    }
    // The router may add an event: the length is its own to say (chunked).
    parts.headers.remove(header::CONTENT_LENGTH);
    if ctx.access.is_some() {
        parts.extensions.insert(ServedBy(lease.replica().address));
    }
    let leased = LeasedBody { inner: body, lease: Some(lease), start, first_byte: false };
    let body = Box::new(super::watched::WatchedStream::new(leased, ctx.endpoint.clone()));
    Response::from_parts(parts, ProxyBody { kind: BodyKind::Watched(body), hold: None, tap: None })
}

fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// [`client_response`] for a stream the router can continue elsewhere:
/// its length is the router's to say now (chunked).
fn resumable_response(
    resp: Response<BackendBody>,
    lease: Lease,
    start: Instant,
    served_by: bool,
    moves: Arc<MoveContext>,
    r: Resumable,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    if body.hop_by_hop() {
        strip_hop_by_hop(&mut parts.headers);
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    if served_by {
        parts.extensions.insert(ServedBy(lease.replica().address));
    }
    let leased = LeasedBody { inner: body, lease: Some(lease), start, first_byte: false };
    let body = Box::new(ResumableBody::new(leased, moves, r));
    Response::from_parts(parts, ProxyBody { kind: BodyKind::Resumable(body), hold: None, tap: None })
}

/// `served_by`: name the replica in the response's extensions (for the
/// access log; an allocation per response otherwise spared).
pub(super) fn client_response(
    resp: Response<BackendBody>,
    lease: Lease,
    start: Instant,
    served_by: bool,
) -> Response<ProxyBody> {
    let (mut parts, body) = resp.into_parts();
    if body.hop_by_hop() {
        strip_hop_by_hop(&mut parts.headers);
    }
    if served_by {
        parts.extensions.insert(ServedBy(lease.replica().address));
    }
    let body = LeasedBody { inner: body, lease: Some(lease), start, first_byte: false };
    Response::from_parts(parts, ProxyBody { kind: BodyKind::Replica(body), hold: None, tap: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's own `x-onepool-*` fields never reach a replica: the
    /// launcher trusts the movable mark (and opens llama-server's
    /// continuation paths) only as the router's (issue #43).
    #[test]
    fn a_client_s_onepool_fields_are_kept_back_in_any_case() {
        for name in ["x-onepool-movable", "X-OnePool-Movable", "x-onepool-replica-key", "X-ONEPOOL-anything"] {
            assert!(is_onepool_field(name.as_bytes()), "{name}");
        }
        for name in ["x-onepool", "x-forwarded-for", "x-request-class", "authorization"] {
            assert!(!is_onepool_field(name.as_bytes()), "{name}");
        }
    }
}
