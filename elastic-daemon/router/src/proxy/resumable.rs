//! A stream the router can continue elsewhere (issue #43): its events
//! pass whole (token ids read, and taken out where the router asked for
//! them), and when its replica cannot finish it the answer moves to
//! another one, the client none the wiser but for a pause.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::HeaderValue;
use http_body::{Body, Frame};

use crate::endpoint::Endpoint;
use crate::metrics::Metrics;
use crate::proxy::leased::{lost_of, LeasedBody};
use crate::proxy::watched::{cut_event, cut_reason, EventTail, ENDED, LOST};
use crate::registry::ReplicaId;
use crate::resume::chunk::{Event, Usage, RECLAIMED};
use crate::resume::events::{data_of, without_key, Data, Splitter, LOGPROBS};
use crate::resume::moving::{continue_elsewhere, Ask, Continuation, Failed, Source};
use crate::resume::plan::Plan;
use crate::resume::progress::{Meta, Progress};
use crate::resume::replay::Replay;
use crate::resume::splice::{error_event, object, DONE};
use crate::resume::{Method, Why};
use crate::settings::ProxySettings;

/// Bytes of one event at most; a longer one is passed on as it is and the
/// stream no longer followed.
const MAX_EVENT: usize = 1 << 20;

type Pending<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a resumable stream shares with the endpoint it belongs to.
pub(super) struct MoveContext {
    pub(super) endpoint: Arc<Endpoint>,
    pub(super) settings: ProxySettings,
    pub(super) max_moves: u32,
}

/// What a request that can be continued carries to its response.
pub(super) struct Resumable {
    pub(super) plan: Plan,
    pub(super) client: Bytes,
    /// The body its first attempt sent (its seed set): what a replay sends.
    pub(super) sent: Bytes,
    pub(super) authorization: Option<HeaderValue>,
    /// Its request class (issue #44): a stream of a lower class yields its
    /// slot to a higher one's request and continues later.
    pub(super) class: Option<crate::classes::Class>,
}

enum State {
    /// Following the replica's events.
    Reading,
    /// Passing bytes as they come (the router cannot follow them).
    Passing,
    /// Waiting for another replica to take the answer over.
    Moving(Pending<Result<Continuation, Failed>>),
    Done,
}

pub(super) struct ResumableBody {
    current: LeasedBody,
    source: Source,
    state: State,
    /// Resolves when the current replica is lost.
    lost: Option<Pending<()>>,
    /// Its class, its registration as a stream that may yield its slot, and
    /// what resolves when it is asked to.
    class: Option<crate::classes::Class>,
    ticket: Option<crate::endpoint::YieldTicket>,
    asked_to_yield: Option<Pending<()>>,
    ctx: Arc<MoveContext>,
    plan: Plan,
    /// The client's request body, as it came.
    client: Bytes,
    /// Its first attempt's body.
    first_body: Bytes,
    /// The client's `Authorization`, where the endpoint passes it on.
    authorization: Option<HeaderValue>,
    progress: Progress,
    splitter: Splitter,
    /// Frames for the client, in order.
    out: std::collections::VecDeque<Bytes>,
    moves: u32,
    tried: Vec<ReplicaId>,
    /// Bytes of the continuation's first text the client already has.
    skip: usize,
    /// The prompt's tokens as a continuation by tokens counted them.
    prompt_tokens: Option<u64>,
    /// A continuation by text: its usage, and the tokens before it.
    continued_usage: Option<Usage>,
    tokens_before: u64,
    moving_since: Instant,
    /// Heap bytes counted in `onepool_router_resume_kept_bytes`.
    counted: usize,
    /// How far the stream got as the client has it, once it is passed
    /// without being followed (issue #50: its early end gets the error
    /// event too).
    tail: EventTail,
    /// Ended with an error event, not whole.
    failed: bool,
    /// A continuation by a prefill went on with the answer: it can no
    /// longer be generated again from its start (issue #51).
    prefilled: bool,
    /// Generating the answer again: how far it has come through what the
    /// client has.
    replay: Option<Replay>,
    /// The client has had an event of the answer (a continuation's role
    /// is then not repeated).
    answered: bool,
    /// Log-probabilities of tokens a continuation generates again that the
    /// client has already (by text, issue #51).
    regenerated: usize,
}

impl ResumableBody {
    pub(super) fn new(current: LeasedBody, ctx: Arc<MoveContext>, r: Resumable) -> ResumableBody {
        let Resumable { plan, client, sent, authorization, class } = r;
        let lost = current.lease.as_ref().map(lost_of);
        let progress = Progress::new(plan.method);
        let mut body = ResumableBody {
            current,
            source: Source::First,
            state: State::Reading,
            lost,
            class,
            ticket: None,
            asked_to_yield: None,
            ctx,
            plan,
            client,
            first_body: sent,
            authorization,
            progress,
            splitter: Splitter::default(),
            out: std::collections::VecDeque::new(),
            moves: 0,
            tried: Vec::new(),
            skip: 0,
            prompt_tokens: None,
            continued_usage: None,
            tokens_before: 0,
            moving_since: Instant::now(),
            counted: 0,
            tail: EventTail::default(),
            failed: false,
            prefilled: false,
            replay: None,
            answered: false,
            regenerated: 0,
        };
        body.register_yieldable();
        body
    }

    /// On an endpoint with classes, the stream on its current replica may
    /// give its slot to a higher class's request, unless it continues only
    /// by being generated again (a grammar, several choices, a tool call or
    /// reasoning begun): a yield would make it again from its start.
    fn register_yieldable(&mut self) {
        if self.only_replayed() {
            return;
        }
        let (Some(class), Some(lease)) = (&self.class, &self.current.lease) else { return };
        let ticket = self.ctx.endpoint.yieldable(lease, class.rank);
        let signal = ticket.signal.clone();
        self.asked_to_yield = Some(Box::pin(async move { signal.wait().await }));
        self.ticket = Some(ticket);
    }

    /// The answer can continue only by being generated again.
    fn only_replayed(&self) -> bool {
        self.plan.replay_only || self.progress.sent.beyond_text()
    }

    /// Times the answer moved to another replica.
    pub(super) fn moves(&self) -> u32 {
        self.moves
    }

    pub(super) fn finish(&mut self) -> Option<Instant> {
        self.current.finish()
    }

    /// Ended by the router's error event rather than whole.
    pub(super) fn ended_by_error(&self) -> bool {
        self.failed
    }

    fn metrics(&self) -> &Metrics {
        self.ctx.endpoint.metrics()
    }

    fn read(&mut self, data: Bytes) {
        if matches!(self.state, State::Passing) {
            self.tail.push(&data);
            self.out.push_back(data);
            return;
        }
        self.splitter.push(data);
        while matches!(self.state, State::Reading) {
            let Some(event) = self.splitter.next_event() else { break };
            self.event(event);
        }
        if matches!(self.state, State::Reading) && self.splitter.held() > MAX_EVENT {
            let rest = self.splitter.take_rest();
            self.unfollow(rest);
        }
        self.count_kept();
    }

    /// The router stops following: what it holds goes as it is.
    fn unfollow(&mut self, event: Bytes) {
        if self.source == Source::First {
            self.tail.push(&event);
            self.out.push_back(event);
            self.state = State::Passing;
            let rest = self.splitter.take_rest();
            if !rest.is_empty() {
                self.tail.push(&rest);
                self.out.push_back(rest);
            }
        } else {
            // A continuation's own form is never passed raw.
            self.fail("the replica that continued it sent an event the router cannot read");
        }
    }

    fn event(&mut self, event: Bytes) {
        let data = match data_of(&event) {
            Data::One(d) => d,
            Data::None => {
                if self.source == Source::First {
                    self.out.push_back(event);
                }
                return;
            }
            Data::Other => return self.unfollow(event),
        };
        if data == b"[DONE]" {
            self.progress.done = true;
            match self.source {
                Source::First => self.out.push_back(event),
                _ => self.complete(),
            }
            return;
        }
        let Some(e) = Event::parse(data) else { return self.unfollow(event) };
        if let Some(err) = &e.error {
            if err.code.as_deref() == Some(RECLAIMED) {
                return self.cut(Why::Reclaimed);
            }
            return self.unfollow(event.clone());
        }
        if e.legacy_function_call() {
            return self.unfollow(event.clone());
        }
        if self.progress.meta.is_none() {
            self.progress.meta = Meta::of(&e);
        }
        if let Some(u) = e.usage {
            self.progress.usage_seen = true;
            if self.source != Source::First {
                self.continued_usage = Some(u);
            }
        }
        match self.source {
            Source::Replay => self.replayed(data),
            _ => self.pass(&event, data, &e),
        }
    }

    /// An event of the first replica or of a continuation by a prefill, to
    /// the client.
    fn pass(&mut self, event: &Bytes, data: &[u8], e: &Event<'_>) {
        self.progress.note_tokens(e.tokens());
        let said = e.text();
        let text = said.unwrap_or_default();
        let finish = e.finish_reason();
        if said.is_some() {
            self.progress.note_text(text);
        }
        match self.source {
            Source::First => {
                self.progress.sent.record(e);
                let stripped = self.plan.ids_asked.then(|| without_key(event, &LOGPROBS)).flatten();
                self.out.push_back(stripped.unwrap_or_else(|| event.clone()));
                self.answered = true;
                if self.ticket.is_some() && self.only_replayed() {
                    // A tool call or reasoning began: it no longer yields.
                    (self.ticket, self.asked_to_yield) = (None, None);
                }
            }
            Source::OpenAi => {
                self.progress.sent.record(e);
                let meta = self.progress.meta.as_ref().expect("set before a move");
                if let Some(passed) = meta.restamp(data, !self.answered, &mut self.regenerated) {
                    self.out.push_back(passed);
                    self.answered = true;
                }
            }
            Source::Native => {
                let skipped = self.skip.min(text.len());
                self.skip -= skipped;
                let visible = text.get(skipped..).unwrap_or_default();
                let meta = self.progress.meta.as_ref().expect("set before a move");
                if !visible.is_empty() {
                    self.out.push_back(meta.text_event(self.plan.api, visible));
                }
                if let Some(f) = &finish {
                    self.out.push_back(meta.finish_event(self.plan.api, f));
                }
                self.progress.sent.record_native(visible, e.tokens().len(), finish.is_some());
            }
            Source::Replay => unreachable!("read by replayed"),
        }
        self.note_finish(finish.map(Cow::into_owned));
    }

    /// Once every choice has its finish reason the answer is over
    /// (llama.cpp's stream ends with its last event; an OpenAI one still
    /// sends usage and `[DONE]`).
    fn note_finish(&mut self, finish: Option<String>) {
        if self.progress.finish.is_some() || !self.progress.sent.finished(self.plan.choices) {
            return;
        }
        self.progress.finish = Some(finish.unwrap_or_else(|| "stop".into()));
        if self.source == Source::Native {
            self.complete();
        }
    }

    /// An event of the answer generated again: what the client has of it
    /// is left out (and checked), the rest passes as the first replica
    /// would have written it.
    fn replayed(&mut self, data: &[u8]) {
        let Some(mut e) = object(data) else { return self.unfollow(Bytes::new()) };
        let replay = self.replay.as_mut().expect("set by the move");
        if let Err(why) = replay.skip(&self.progress.sent, &mut e) {
            let name = self.ctx.endpoint.name();
            tracing::info!(endpoint = %name, "an answer generated again came out otherwise than its client has it: {why}");
            self.ctx.endpoint.note_move(Err("diverged"));
            return self.fail(&format!("the answer generated again on another replica came out otherwise ({why})"));
        }
        let meta = self.progress.meta.as_ref().expect("set before a move");
        let Some(out) = meta.restamp_map(e, !self.answered, &mut 0) else { return };
        let Some(passed) = Event::parse(out.get(6..out.len() - 2).unwrap_or_default()) else { return };
        self.progress.note_tokens(passed.tokens());
        if let Some(t) = passed.text() {
            self.progress.note_text(t);
        }
        self.progress.sent.record(&passed);
        let finish = passed.finish_reason().map(Cow::into_owned);
        let stripped = self.plan.ids_asked.then(|| without_key(&out, &LOGPROBS)).flatten();
        self.out.push_back(stripped.unwrap_or(out));
        self.answered = true;
        self.note_finish(finish);
    }

    /// The answer is over: what the client still lacks of its end (usage
    /// it asked for, `[DONE]`), then nothing more.
    fn complete(&mut self) {
        if self.source != Source::First || !self.progress.usage_seen {
            if let (true, Some(usage)) = (self.plan.include_usage, self.usage()) {
                let meta = self.progress.meta.as_ref().expect("set before a move");
                self.out.push_back(meta.usage_event(self.plan.api, usage.prompt_tokens, usage.completion_tokens));
            }
        }
        if self.source != Source::First || !self.progress.done {
            self.out.push_back(Bytes::from_static(DONE));
        }
        self.end();
    }

    /// The answer's usage as if it had not moved: the prompt once, the
    /// tokens the client got.
    fn usage(&self) -> Option<Usage> {
        if self.source == Source::Replay {
            // The answer generated again counted all of it.
            return self.continued_usage;
        }
        let completion_tokens = self.progress.completion_tokens();
        match (self.plan.method, self.continued_usage) {
            (Method::Tokens, _) => Some(Usage { prompt_tokens: self.prompt_tokens?, completion_tokens }),
            (Method::Text, Some(u)) => Some(Usage {
                prompt_tokens: u.prompt_tokens.saturating_sub(self.tokens_before),
                completion_tokens: self.tokens_before + u.completion_tokens,
            }),
            (Method::Text, None) => None,
        }
    }

    fn end(&mut self) {
        if let (false, Some(c)) = (matches!(self.state, State::Done), &self.class) {
            let (name, tokens) = (self.ctx.endpoint.name(), self.progress.completion_tokens());
            self.metrics().count_class_tokens(name, &c.name, tokens);
        }
        self.state = State::Done;
        self.lost = None;
        (self.ticket, self.asked_to_yield) = (None, None);
        let _ = self.current.finish();
    }

    /// Ends the answer with the error event: it could not be continued.
    fn fail(&mut self, why: &str) {
        self.failed = true;
        self.out.push_back(error_event(&format!(
            "the replica serving this answer could not finish it and onepool could not continue it elsewhere ({why}); retry the request"
        )));
        self.end();
    }

    /// The replica cannot finish the answer (or, `Yielded`, gives its slot
    /// to a higher class): it moves, if it may.
    fn cut(&mut self, why: Why) {
        if self.progress.finish.is_some() {
            // Only the answer's end was lost.
            return self.complete();
        }
        let name = self.ctx.endpoint.name().to_string();
        // A stream cut before its client had any of it is sent again as it
        // was: no prefill is needed (nor right for a model that reasons).
        let replay = self.only_replayed() || self.progress.sent.is_empty();
        let yielded = why == Why::Yielded;
        if self.cannot_move(replay, yielded) {
            return;
        }
        if let Some(lease) = &self.current.lease {
            match why {
                Why::Yielded => {}
                Why::Reclaimed => self.ctx.endpoint.backend_draining(lease.id()),
                _ => self.ctx.endpoint.exchange_failed(lease.id()),
            }
            if !yielded {
                self.tried.push(lease.id());
            }
            let (replica, why) = (lease.address(), why.as_str());
            tracing::info!(endpoint = %name, %replica, why, "moving a stream to another replica");
        }
        let _ = self.current.finish();
        (self.lost, self.ticket, self.asked_to_yield) = (None, None, None);
        if !yielded {
            self.moves += 1;
        }
        self.ctx.endpoint.note_move(Ok(why));
        if let Some(c) = &self.class {
            let event = if yielded { crate::metrics::ClassEvent::Yielded } else { crate::metrics::ClassEvent::Moved };
            self.metrics().count_class(&name, &c.name, event);
        }
        if self.progress.meta.is_none() {
            self.progress.meta = Some(Meta::made_up(&self.plan));
        }
        let (ids, left) = match replay {
            true => {
                (self.regenerated, self.skip, self.tokens_before) = (0, 0, 0);
                (Vec::new(), self.plan.max_tokens)
            }
            false => {
                self.regenerated = self.progress.regenerated();
                let (ids, skip) = self.progress.resume_point();
                let ids = ids.to_vec();
                self.skip = skip;
                self.tokens_before = self.progress.completion_tokens();
                (ids, self.plan.max_tokens.map(|m| m.saturating_sub(self.tokens_before)))
            }
        };
        if left == Some(0) {
            // The budget is spent: the answer ends here, as it would have.
            let meta = self.progress.meta.as_ref().expect("set above");
            self.out.push_back(meta.finish_event(self.plan.api, "length"));
            self.progress.finish = Some("length".into());
            // Cut before any usage or `[DONE]` came: both are the router's.
            return self.complete();
        }
        let s = &self.ctx.settings;
        let ask = Ask {
            endpoint: self.ctx.endpoint.clone(),
            connect_timeout: s.connect_timeout,
            request_timeout: s.request_timeout,
            idle_timeout: s.response_idle_timeout,
            authorization: self.authorization.clone(),
            exclude: self.tried.clone(),
            plan: self.plan.clone(),
            client: self.client.clone(),
            ids,
            text: self.progress.text().to_string(),
            replay: replay.then(|| self.first_body.clone()),
            left,
            attempts: s.retries + 1,
            rank: self.class.as_ref().map(|c| c.rank).unwrap_or_default(),
            lower: self.class.as_ref().is_some_and(|c| c.lower),
            // A yielded stream waits behind the classes above it as long as
            // a request may wait for its answer, not the queue timeout.
            wait: yielded.then_some(s.request_timeout),
        };
        self.moving_since = Instant::now();
        self.state = State::Moving(Box::pin(continue_elsewhere(ask)));
    }

    /// Ends the answer with the error event when it may not move (and
    /// says so): `true` then.
    fn cannot_move(&mut self, replay: bool, yielded: bool) -> bool {
        let (label, why) = if self.progress.past_kept(replay) {
            ("too_long", "the answer is longer than the router keeps to continue one")
        } else if replay && self.prefilled {
            (
                "tool_call_cut",
                "a tool call or reasoning began after a continuation by text, so the answer cannot be generated again",
            )
        } else if !yielded && self.moves >= self.ctx.max_moves {
            // A yield is no failure: it is bounded by the classes above it,
            // not by max_moves, and the replica may take the answer back.
            ("max_moves", "it moved as many times as the endpoint allows")
        } else {
            return false;
        };
        self.ctx.endpoint.note_move(Err(label));
        self.fail(why);
        true
    }

    /// A stream passed without being followed ended before its answer:
    /// the error event, unless its last event already ended it.
    fn passing_ended(&mut self, code: &str, why: &str) {
        if !self.tail.ended() {
            self.failed = true;
            let event = cut_event(&self.tail, &self.ctx.endpoint, &self.current, code, why);
            self.out.push_back(event);
        }
        self.end();
    }

    fn moved(&mut self, r: Result<Continuation, Failed>) {
        let pause = self.moving_since.elapsed().as_secs_f64();
        self.metrics().observe_move_pause(self.ctx.endpoint.name(), pause);
        match r {
            Ok(c) => {
                self.lost = Some(lost_of(&c.lease));
                self.current =
                    LeasedBody { inner: c.body, lease: Some(c.lease), start: Instant::now(), first_byte: true };
                self.register_yieldable();
                self.source = c.source;
                self.prefilled |= matches!(c.source, Source::Native | Source::OpenAi);
                self.replay = (c.source == Source::Replay).then(Replay::default);
                if c.prompt_tokens.is_some() {
                    self.prompt_tokens = c.prompt_tokens;
                }
                self.continued_usage = None;
                self.splitter = Splitter::default();
                self.state = State::Reading;
            }
            Err(e) => {
                tracing::info!(endpoint = %self.ctx.endpoint.name(), "a stream could not be continued: {e}");
                self.ctx.endpoint.note_move(Err(e.label()));
                self.fail(&e.to_string());
            }
        }
    }

    /// Keeps `onepool_router_resume_kept_bytes` up to date (only when an
    /// allocation grew: rarely).
    fn count_kept(&mut self) {
        let now = self.progress.kept_bytes() + self.splitter.held();
        if now != self.counted {
            let g = &self.metrics().resume_kept_bytes;
            g.inc_by(now as i64 - self.counted as i64);
            self.counted = now;
        }
    }
}

impl Drop for ResumableBody {
    fn drop(&mut self) {
        if self.counted > 0 {
            self.metrics().resume_kept_bytes.dec_by(self.counted as i64);
        }
    }
}

impl Body for ResumableBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let this = self.get_mut();
        loop {
            if let Some(frame) = this.out.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(frame))));
            }
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Moving(continuation) => {
                    let r = ready!(continuation.as_mut().poll(cx));
                    this.moved(r);
                }
                State::Reading | State::Passing => {
                    let following = matches!(this.state, State::Reading);
                    let polled = Pin::new(&mut this.current).poll_frame(cx);
                    // Looked at only while the replica sends nothing: one
                    // that sends is not lost (and a frame costs no poll).
                    if let (Poll::Pending, Some(lost)) = (&polled, &mut this.lost) {
                        if lost.as_mut().poll(cx).is_ready() {
                            match following {
                                true => this.cut(Why::Lost),
                                false => this.passing_ended(LOST.0, LOST.1),
                            }
                            continue;
                        }
                    }
                    if let (Poll::Pending, true, Some(asked)) = (&polled, following, &mut this.asked_to_yield) {
                        if asked.as_mut().poll(cx).is_ready() {
                            this.cut(Why::Yielded);
                            continue;
                        }
                    }
                    match ready!(polled) {
                        Some(Ok(frame)) => {
                            if let Ok(data) = frame.into_data() {
                                this.read(data);
                            }
                        }
                        Some(Err(e)) if !following => {
                            let (code, why) = cut_reason(&e);
                            this.passing_ended(code, &why);
                        }
                        Some(Err(e)) => this.cut(match e.kind() {
                            std::io::ErrorKind::TimedOut => Why::Silent,
                            _ => Why::Failed,
                        }),
                        None if !following => this.passing_ended(ENDED.0, ENDED.1),
                        None if this.progress.done && this.source == Source::First => this.end(),
                        None => this.cut(Why::Ended),
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done) && self.out.is_empty()
    }
}
