//! Slurm's side: placing jobs on nodes within QOS limits, the scheduling
//! pass, and preemption (victims picked, reclaimed as their class says).

use onepool_decisions::annotation::ReclaimMode;

use crate::engine::state::{Ev, Kind, Sim, St};
use crate::slurm::{pick_victims, Holder, IMMEDIATE_FREE_S};

impl Sim<'_> {
    pub(super) fn allowed_nodes(&self, id: usize) -> std::ops::Range<usize> {
        self.island_nodes.get(self.live[id].island).cloned().unwrap_or(0..0)
    }

    pub(super) fn fits_type(&self, id: usize, node: usize) -> bool {
        self.live[id].gpu_type.is_none() || self.live[id].gpu_type == self.node_type[node]
    }

    /// First-fit placement: (node, mask) per node, lowest nodes and GPU indices.
    pub(super) fn place(&self, id: usize) -> Option<Vec<(usize, u64)>> {
        let (n, per) = (self.live[id].nodes, self.live[id].per_node);
        let mut out = Vec::new();
        for node in self.allowed_nodes(id) {
            if !self.fits_type(id, node) || self.free[node].count_ones() < per {
                continue;
            }
            let mut m = 0u64;
            let mut f = self.free[node];
            for _ in 0..per {
                let low = f & f.wrapping_neg();
                m |= low;
                f &= !low;
            }
            out.push((node, m));
            if out.len() as u32 == n {
                return Some(out);
            }
        }
        None
    }

    pub(super) fn within_limits(&self, id: usize) -> bool {
        let Some(m) = self.model else { return true };
        let (class, g) = (self.live[id].class, self.gpus(id));
        let q = &m.classes[class];
        if q.grp_gpus.is_some_and(|cap| self.used[class] + g > cap) {
            return false;
        }
        if !q.protected {
            if let Some(cap) = m.flexible_cap {
                let flex: u32 = (0..self.used.len()).filter(|&c| !m.classes[c].protected).map(|c| self.used[c]).sum();
                if flex + g > cap {
                    return false;
                }
            }
        }
        true
    }

    pub(super) fn start(&mut self, id: usize, alloc: Vec<(usize, u64)>) {
        for &(node, mask) in &alloc {
            self.free[node] &= !mask;
        }
        let class = self.live[id].class;
        let g = self.gpus(id);
        self.used[class] += g;
        self.peak_gpus = self.peak_gpus.max(self.used.iter().sum());
        let s = &mut self.stats[class];
        s.peak_gpus = s.peak_gpus.max(self.used[class]);
        let now = self.now;
        let l = &mut self.live[id];
        l.alloc = alloc;
        l.st = St::Running;
        l.start = now;
        let (gen, kind, submit, first) = (l.gen, l.kind, l.submit, l.gen == 0);
        match kind {
            Kind::Batch { job } => {
                if first {
                    self.stats[class].waits.push(now - self.w.jobs[job].submit);
                }
                self.stats[class].time_to_capacity.push(now - submit);
                let rem = self.live[id].remaining;
                self.push(now + rem, Ev::End { job: id, gen });
            }
            Kind::Replica { ep } => {
                let s = if self.live[id].preloaded { 0.0 } else { self.w.endpoints[ep].startup_s };
                self.live[id].preloaded = false;
                self.push(now + s, Ev::Ready { job: id, gen });
            }
        }
    }

    /// One pass of the scheduler (see the Slurm model for the rules). A
    /// job that waits for GPUs being reclaimed for it (or for borrowers to
    /// pass PreemptExemptTime) holds back every lower-priority job, so what
    /// is freed for it is not taken by others first.
    pub(super) fn schedule(&mut self) {
        for k in 0..self.order.len() {
            let class = self.order[k];
            let mut i = 0;
            while let Some(&id) = self.pending[class].get(i) {
                if self.live[id].st != St::Pending {
                    self.pending[class].remove(i);
                    continue;
                }
                if self.live[id].not_before > self.now {
                    // Held (a requeued job's BeginTime): it blocks no one.
                    i += 1;
                    continue;
                }
                if !self.within_limits(id) {
                    break;
                }
                if let Some(a) = self.place(id) {
                    self.pending[class].remove(i);
                    self.start(id, a);
                    continue;
                }
                if self.model.is_some() {
                    let coming = if self.now >= self.live[id].reclaim_wait { self.preempt_for(id) } else { true };
                    if coming {
                        return;
                    }
                }
                break;
            }
        }
    }

    /// Picks and reclaims victims for a pending job; whether GPUs are
    /// coming for it (victims draining, or borrowers soon past the exempt time).
    pub(super) fn preempt_for(&mut self, id: usize) -> bool {
        let Some(m) = self.model else { return false };
        let class = self.live[id].class;
        let preempts = &m.classes[class].preempts;
        if preempts.is_empty() {
            return false;
        }
        let mut view: Vec<(u32, Vec<Holder>)> = Vec::new();
        let nodes: Vec<usize> = self.allowed_nodes(id).filter(|&n| self.fits_type(id, n)).collect();
        let mut node_pos = vec![usize::MAX; self.free.len()];
        for (i, &n) in nodes.iter().enumerate() {
            node_pos[n] = i;
            view.push((self.free[n].count_ones(), Vec::new()));
        }
        let mut next_eligible = f64::INFINITY;
        for (j, l) in self.live.iter().enumerate() {
            if !matches!(l.st, St::Running | St::Draining) || !preempts.contains(&l.class) {
                continue;
            }
            let old_enough = self.now - l.start >= m.exempt_s;
            if !old_enough && !l.being_reclaimed {
                next_eligible = next_eligible.min(l.start + m.exempt_s);
            }
            for &(node, mask) in &l.alloc {
                if node_pos[node] != usize::MAX {
                    view[node_pos[node]].1.push(Holder {
                        job: j,
                        priority: m.classes[l.class].priority,
                        lowest_gpu: mask.trailing_zeros(),
                        gpus: mask.count_ones(),
                        eligible: old_enough && !l.being_reclaimed && l.st == St::Running,
                    });
                }
            }
        }
        let Some(victims) = pick_victims(&view, self.live[id].nodes, self.live[id].per_node) else {
            // Blocked only by PreemptExemptTime: look again when the next borrower becomes reclaimable.
            if next_eligible.is_finite() && (self.wake_at <= self.now || next_eligible < self.wake_at) {
                self.wake_at = next_eligible;
                self.push(next_eligible, Ev::Wake);
            }
            return next_eligible.is_finite();
        };
        let mut wait = self.now;
        for v in victims {
            let vclass = self.live[v].class;
            self.stats[vclass].reclaims += 1;
            self.live[v].being_reclaimed = true;
            self.live[v].notice = self.now;
            let gen = self.live[v].gen;
            let free_at = match (self.live[v].kind, self.live[v].reclaim) {
                (_, None | Some(ReclaimMode::Immediate)) => self.now + IMMEDIATE_FREE_S,
                (Kind::Replica { ep }, Some(_)) => {
                    // Graceful: stop sending it requests; free when drained or at the drain timeout.
                    self.eps[ep].active.retain(|&x| x != v);
                    self.live[v].st = St::Draining;
                    let limit = self.now + m.batch_free_after(self.live[v].reclaim, self.live[v].drain, vclass, None);
                    if self.live[v].inflight == 0 || !self.live[v].ready {
                        self.now + IMMEDIATE_FREE_S
                    } else {
                        limit
                    }
                }
                (Kind::Batch { .. }, mode) => {
                    let by_itself = self.w.victims.get(vclass).and_then(|v| v.release_after_s);
                    self.now + m.batch_free_after(mode, self.live[v].drain, vclass, by_itself)
                }
            };
            if let Kind::Replica { ep } = self.live[v].kind {
                self.eps[ep].active.retain(|&x| x != v);
                if self.live[v].st == St::Running {
                    self.live[v].st = St::Draining;
                }
            }
            wait = wait.max(free_at);
            self.push(free_at, Ev::Free { job: v, gen });
        }
        self.live[id].reclaim_wait = wait;
        true
    }

    /// What was never done counts against the run: jobs never started wait
    /// until the cut-off, requests never served are delayed until it.
    pub(super) fn finish(&mut self, cutoff: f64) {
        for l in &self.live {
            if let Kind::Batch { job } = l.kind {
                if l.st == St::Pending && l.gen == 0 {
                    self.stats[l.class].waits.push(cutoff - self.w.jobs[job].submit);
                    self.stats[l.class].unstarted_jobs += 1;
                }
            }
        }
        for (ep, e) in self.eps.iter().enumerate() {
            let spec = &self.w.endpoints[ep];
            let s = &mut self.stats[spec.class];
            for (arr, _) in &e.queue {
                s.delays.push((cutoff - arr) as f32);
                s.unserved += 1;
            }
            for r in &spec.requests[e.next_req..] {
                s.delays.push((cutoff - r.t).max(0.0) as f32);
                s.unserved += 1;
            }
        }
    }
}
