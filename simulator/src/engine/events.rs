//! The event loop: time advancing, jobs submitted and released, and each
//! event handled in the order the queue gives.

use onepool_decisions::annotation::ReclaimMode;

use crate::engine::model::{Cancelled, JobLogEntry};
use crate::engine::state::{Ev, Item, Kind, Live, Sim, St};
use crate::slurm::{REQUEUE_HOLD_S, SCHED_INTERVAL_S};

impl Sim<'_> {
    pub(super) fn type_of(&self, t: Option<&str>) -> Option<usize> {
        t.and_then(|t| self.types.iter().position(|x| x == t)).or(t.map(|_| usize::MAX))
    }

    pub(super) fn push(&mut self, t: f64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Item(t, ev.rank(), self.seq, ev));
    }

    pub(super) fn endpoints_busy(&self) -> bool {
        self.eps
            .iter()
            .enumerate()
            .any(|(i, e)| e.next_req < self.w.endpoints[i].requests.len() || !e.queue.is_empty() || e.inflight > 0)
    }

    pub(super) fn main_loop(&mut self) {
        let cutoff = self.w.t1 + self.cfg.grace_after_s;
        let tick = self.cfg.tick_s.max(1e-3);
        let mut next_tick = if self.w.endpoints.is_empty() { f64::INFINITY } else { self.w.t0 };
        loop {
            let t_heap = self.heap.peek().map(|i| i.0).unwrap_or(f64::INFINITY);
            let t_job = self.w.jobs.get(self.next_job).map(|j| j.submit).unwrap_or(f64::INFINITY);
            let mut t_req = f64::INFINITY;
            for (i, e) in self.eps.iter().enumerate() {
                if let Some(r) = self.w.endpoints[i].requests.get(e.next_req) {
                    t_req = t_req.min(r.t);
                }
            }
            let busy = self.endpoints_busy();
            let t_tick = if busy { next_tick } else { f64::INFINITY };
            let t = t_heap.min(t_job).min(t_req).min(t_tick);
            if !t.is_finite() || t > cutoff {
                break;
            }
            self.advance(t);
            // Events at this instant, in a fixed order: heap, submissions, arrivals, tick.
            while self.heap.peek().is_some_and(|i| i.0 <= t) {
                let Item(_, _, _, ev) = self.heap.pop().unwrap();
                self.events += 1;
                self.handle(ev);
            }
            while self.w.jobs.get(self.next_job).is_some_and(|j| j.submit <= t) {
                self.submit_batch(self.next_job);
                self.next_job += 1;
            }
            for ep in 0..self.eps.len() {
                let reqs = &self.w.endpoints[ep].requests;
                let mut arrived = false;
                while let Some(r) = reqs.get(self.eps[ep].next_req).filter(|r| r.t <= t) {
                    self.eps[ep].queue.push_back((r.t, r.service));
                    self.eps[ep].next_req += 1;
                    self.events += 1;
                    arrived = true;
                }
                if arrived {
                    self.dispatch(ep);
                }
            }
            if t_tick <= t {
                for ep in 0..self.eps.len() {
                    if !self.eps[ep].done {
                        self.autoscale(ep);
                    }
                }
                next_tick += tick;
            }
            for ep in 0..self.eps.len() {
                if !self.eps[ep].done && self.endpoint_finished(ep) {
                    self.retire(ep);
                }
            }
            if self.dirty {
                self.dirty = false;
                self.schedule();
            }
        }
        self.finish(cutoff);
    }

    /// Integrates GPUs held and demanded from `self.now` to `t`.
    pub(super) fn advance(&mut self, t: f64) {
        let dt = t - self.now;
        if dt <= 0.0 {
            return;
        }
        let (t0, t1, b) = (self.w.t0, self.w.t1, self.cfg.bucket_s.max(1.0));
        let flex_used: f64 = self
            .model
            .map(|m| (0..self.used.len()).filter(|&c| !m.classes[c].protected).map(|c| f64::from(self.used[c])).sum())
            .unwrap_or(0.0);
        let borrowed = (flex_used - self.unprotected).max(0.0);
        let total_used: f64 = self.used.iter().map(|&u| f64::from(u)).sum();
        let in_win = (t.min(t1) - self.now.max(t0)).max(0.0);
        self.used_in_window += total_used * in_win;
        if total_used > 0.0 {
            self.last_busy = t;
        }
        for c in 0..self.used.len() {
            let u = f64::from(self.used[c]);
            let d = self.demand[c];
            let s = &mut self.stats[c];
            s.used_gpu_s += u * dt;
            if borrowed > 0.0 && self.model.is_some_and(|m| !m.classes[c].protected) {
                s.borrowed_gpu_s += borrowed * u / flex_used * dt;
            }
            if let Some(q) = self.model.map(|m| &m.classes[c]).filter(|q| q.protected) {
                let cap = f64::from(q.grp_gpus.unwrap_or(0));
                s.unused_capacity_gpu_s += (cap - u).max(0.0) * in_win;
                s.unused_reserved_gpu_s += (f64::from(q.reserved) - u).max(0.0) * in_win;
            }
            if u == 0.0 && d == 0.0 {
                continue;
            }
            let mut from = self.now;
            while from < t {
                let k = ((from - t0) / b).floor().max(0.0) as usize;
                let edge = (t0 + (k as f64 + 1.0) * b).min(t);
                let span = edge - from;
                if s.alloc.len() <= k {
                    s.alloc.resize(k + 1, 0.0);
                    s.demand.resize(k + 1, 0.0);
                }
                s.alloc[k] += u * span / b;
                s.demand[k] += d * span / b;
                from = if edge > from { edge } else { t };
            }
        }
        self.now = t;
    }

    pub(super) fn new_live(
        &mut self,
        kind: Kind,
        class: usize,
        island: usize,
        gpus: u32,
        per_node: u32,
        ty: Option<&str>,
    ) -> usize {
        let per = per_node.max(1);
        let gpu_type = self.type_of(ty);
        let (reclaim, drain, remaining) = match kind {
            Kind::Batch { job } => (self.w.jobs[job].reclaim, self.w.jobs[job].drain, self.w.jobs[job].duration),
            Kind::Replica { ep } => (self.w.endpoints[ep].reclaim, self.w.endpoints[ep].drain, f64::INFINITY),
        };
        self.live.push(Live {
            kind,
            class,
            island,
            nodes: gpus.div_ceil(per).max(1),
            per_node: per.min(gpus.max(1)),
            gpu_type,
            submit: self.now,
            remaining,
            st: St::Pending,
            start: 0.0,
            alloc: Vec::new(),
            gen: 0,
            ready: false,
            inflight: 0,
            being_reclaimed: false,
            reclaim,
            drain,
            reclaim_wait: f64::NEG_INFINITY,
            notice: 0.0,
            not_before: f64::NEG_INFINITY,
            preloaded: false,
        });
        let id = self.live.len() - 1;
        self.pending[class].push_back(id);
        self.dirty = true;
        id
    }

    pub(super) fn submit_batch(&mut self, j: usize) {
        let job = &self.w.jobs[j];
        let (class, island, gpus, per, ty) = (job.class, job.island, job.gpus, job.per_node, job.gpu_type.clone());
        self.demand[class] += f64::from(gpus);
        self.new_live(Kind::Batch { job: j }, class, island, gpus, per, ty.as_deref());
    }

    pub(super) fn gpus(&self, id: usize) -> u32 {
        self.live[id].nodes * self.live[id].per_node
    }

    pub(super) fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::ReqDone { ep, job, gen } => {
                self.eps[ep].inflight -= 1;
                if self.live[job].gen != gen {
                    return;
                }
                self.live[job].inflight -= 1;
                match self.live[job].st {
                    St::Draining if self.live[job].inflight == 0 => self.release(job),
                    St::Running => {
                        self.eps[ep].slots.push((job, gen));
                        self.dispatch(ep);
                    }
                    _ => {}
                }
            }
            Ev::End { job, gen } => {
                if self.live[job].gen == gen && self.live[job].st == St::Running {
                    self.release(job);
                }
            }
            Ev::Free { job, gen } => {
                if self.live[job].gen == gen && self.live[job].st != St::Done {
                    self.release(job);
                }
            }
            Ev::Ready { job, gen } => {
                if self.live[job].gen != gen || self.live[job].st != St::Running {
                    return;
                }
                let Kind::Replica { ep } = self.live[job].kind else { return };
                self.live[job].ready = true;
                if self.now > self.w.t0 {
                    let ttc = self.now - self.live[job].submit;
                    self.stats[self.live[job].class].time_to_capacity.push(ttc);
                }
                for _ in 0..self.w.endpoints[ep].max_concurrent.max(1) {
                    self.eps[ep].slots.push((job, gen));
                }
                self.dispatch(ep);
            }
            Ev::Wake => self.dirty = true,
        }
    }

    /// Frees a job's GPUs (it ended, drained, or was reclaimed).
    pub(super) fn release(&mut self, id: usize) {
        let class = self.live[id].class;
        let gpus = self.gpus(id);
        // A batch victim whose work ends before it is made to stop simply
        // completes (on Slurm: COMPLETED, not requeued).
        let finished = matches!(self.live[id].kind, Kind::Batch { .. })
            && self.now - self.live[id].start >= self.live[id].remaining;
        let reclaimed = self.live[id].being_reclaimed && !finished;
        for (node, mask) in std::mem::take(&mut self.live[id].alloc) {
            self.free[node] |= mask;
        }
        self.used[class] -= gpus;
        self.dirty = true;
        let victims = self.w.victims.get(class).copied().unwrap_or_default();
        let now = self.now;
        let l = &mut self.live[id];
        l.gen += 1;
        l.ready = false;
        let ran = now - l.start;
        if self.cfg.job_log {
            self.log.push(JobLogEntry { job: id, class, submit: l.submit, start: l.start, end: now, reclaimed });
        }
        let g = f64::from(gpus);
        match l.kind {
            Kind::Batch { .. } if reclaimed && l.reclaim == Some(ReclaimMode::Requeue) => {
                // Checkpointed at the notice: resumes with the work it had
                // left then, once Slurm lets a requeued job start again.
                self.stats[class].lost_gpu_s += g * (now - l.notice).max(0.0);
                l.remaining = (l.remaining - (l.notice - l.start).max(0.0)).max(0.0);
                l.st = St::Pending;
                l.being_reclaimed = false;
                l.submit = now;
                l.not_before = now + REQUEUE_HOLD_S;
                // Started by the first scheduling pass after that: any job
                // event, or Slurm's periodic pass.
                let t0 = self.w.t0;
                let at = t0 + ((l.not_before - t0) / SCHED_INTERVAL_S).ceil() * SCHED_INTERVAL_S;
                self.pending[class].push_back(id);
                self.push(at, Ev::Wake);
            }
            Kind::Batch { .. } if reclaimed => {
                // Cancelled: the run's work is lost.
                self.stats[class].lost_gpu_s += g * ran.max(0.0);
                l.being_reclaimed = false;
                match victims.cancelled {
                    Cancelled::Resubmit => {
                        l.st = St::Pending;
                        l.submit = now;
                        self.pending[class].push_back(id);
                    }
                    Cancelled::Drop => {
                        l.st = St::Done;
                        let s = &mut self.stats[class];
                        s.dropped_jobs += 1;
                        s.dropped_gpu_s += g * l.remaining;
                        self.demand[class] -= g;
                        self.batch_left -= 1;
                    }
                }
            }
            Kind::Batch { .. } => {
                l.st = St::Done;
                self.demand[class] -= g;
                self.batch_left -= 1;
            }
            Kind::Replica { ep } => {
                let lost = l.inflight;
                l.inflight = 0;
                l.st = St::Done;
                self.stats[class].failed_requests += u64::from(lost);
                self.eps[ep].active.retain(|&j| j != id);
            }
        }
    }
}
