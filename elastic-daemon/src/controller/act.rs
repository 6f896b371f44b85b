//! Deciding and acting: the autoscaler's count, then submissions, drains, node
//! releases and cancellations.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use onepool_decisions::backoff::Allowance;
use onepool_decisions::decision_log::DecisionMode;
use onepool_decisions::replicas::{
    pack_submissions, plan_releases, reconcile, Action, EndpointTarget, Headroom, JobLayout, Kind, Phase, Release,
    Replica,
};
use onepool_router::endpoint::EndpointSnapshot;
use onepool_router::registry::ReplicaState;
use onepool_slurm_commands::state::JobInfo;

use crate::controller::sbatch::sbatch_args;
use crate::controller::tracked::{Live, Member, Seen, TrackedJob};
use crate::controller::{blocking, unix_now, Controller};
use crate::round_error::RoundError;

impl Controller {
    /// Every replica still holding GPUs, as reconcile sees it.
    pub(super) fn replicas(
        &self,
        seen: &HashMap<u32, (JobInfo, Live)>,
        snap: &EndpointSnapshot,
        now: Instant,
    ) -> Vec<Replica> {
        let unix = unix_now();
        let mut replicas = Vec::new();
        // A job waiting on its slot's other job is no replica to come: it
        // is cancelled before anything else is decided.
        let surplus = self.surplus_in_slots();
        for (id, t) in &self.tracked {
            let Some((j, l)) = seen.get(id) else { continue };
            if surplus.contains(id) {
                continue;
            }
            let running = *l == Live::Running && j.start_time > 0;
            let age = if running { Duration::from_secs(unix.saturating_sub(j.start_time)) } else { Duration::ZERO };
            // An adopted replica older than startup_timeout would otherwise
            // be replaced before its first health check (issue #18: every
            // restart of onepoold cancelled them).
            let starting_for = match t.seen_running {
                Some(seen) if running => age.min(now.saturating_duration_since(seen)),
                _ => Duration::ZERO,
            };
            // Slurm prints huge values for UNLIMITED.
            let time_left = (running && j.time_limit > 0 && j.time_limit < 1 << 31)
                .then(|| Duration::from_secs((j.start_time + j.time_limit * 60).saturating_sub(unix)));
            let holding = t.members.values().filter(|m| !m.released).count();
            for (port, m) in &t.members {
                if m.released {
                    continue;
                }
                let r = m.address.and_then(|a| snap.replicas.iter().find(|r| r.address == a));
                let mut in_flight = r.map(|r| r.in_flight).unwrap_or(0);
                let phase = match (l, r.map(|r| r.state)) {
                    (Live::Pending, _) => Phase::Pending,
                    _ if m.draining() => Phase::Draining,
                    (_, Some(ReplicaState::Draining)) => Phase::Draining,
                    (_, Some(ReplicaState::Ready | ReplicaState::Out)) => Phase::Serving,
                    _ => Phase::Starting,
                };
                // A drain past its timeout ends like a finished one.
                if m.ended || m.drain_started.is_some_and(|d| now.duration_since(d) >= self.settings.drain_timeout) {
                    in_flight = 0;
                }
                replicas.push(Replica {
                    job: *id,
                    slot: *port,
                    pinned: holding > 1 && m.node.is_some() && m.node == t.batch_host,
                    kind: t.kind,
                    phase,
                    in_flight,
                    age,
                    starting_for,
                    time_left,
                    being_preempted: j.is_being_preempted(),
                });
            }
        }
        replicas
    }

    /// How many replicas the endpoint wants now, from its load (recorded
    /// for the autoscaler and shown in the view).
    pub(super) async fn decide(&mut self, snap: &EndpointSnapshot, replicas: &[Replica], now: Instant) -> u32 {
        let (load, scraped) = self.load(snap).await;
        // The endpoint's own count: replicas that leave do not take their
        // requests out of the rate (issue #18: 0.0 requests/s was shown at
        // about 27 while a replica drained).
        let served = snap.served_total;
        let rate = match self.last_served {
            Some((before, at)) if served >= before && now > at => (served - before) as f64 / (now - at).as_secs_f64(),
            _ => 0.0,
        };
        self.last_served = Some((served, now));
        let secs = now.duration_since(self.started).as_secs_f64();
        self.autoscaler.record(secs, load);
        for l in self.endpoint.take_latencies() {
            let at = l.at.saturating_duration_since(self.started).as_secs_f64();
            self.autoscaler.record_latency(at, l.ttfb, l.queued);
        }
        let ready = replicas.iter().filter(|r| r.phase == Phase::Serving).count() as u32;
        let rec = self.autoscaler.recommend(secs, ready);
        let latency = rec.latency.map(|v| self.latency_verdict(&v));
        let mut desired = rec.replicas;
        let restarted = now.duration_since(self.started) < self.settings.scale_down_delay;
        if restarted {
            desired = desired.max(self.adopted.unwrap_or(0));
        }
        let (min, max) = (self.settings.min, self.settings.max.max(self.settings.min));
        let clamped = desired.clamp(min, max);
        let mut lower = self.lower_share(snap, load, secs, ready, clamped);
        if restarted {
            // The adopted lower-class replicas keep their kind while the
            // restart holds the count: else each would be drained for an
            // own-class one to replace it.
            let live = replicas.iter().filter(|r| r.kind == Kind::Lower && r.phase != Phase::Draining).count() as u32;
            lower = lower.max(live).min(clamped - min);
        }
        self.seen = Seen { desired, lower, serving: ready, load };
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.desired = clamped;
        v.lower = lower;
        v.load = load;
        v.rate = rate;
        v.latency = latency;
        v.scraped = scraped;
        desired
    }

    /// Of `desired` (within [min, max]), the replicas only the request
    /// classes below the endpoint's own ask for (issue #44): what the whole
    /// load wants beyond what the load of the endpoint's own class and
    /// those above it wants, each by the same rule and windows. 0 without a
    /// `lower_workload`.
    fn lower_share(&mut self, snap: &EndpointSnapshot, load: f64, secs: f64, ready: u32, desired: u32) -> u32 {
        let Some(own) = self.own_autoscaler.as_mut() else { return 0 };
        own.record(secs, (load - lower_part(&snap.classes, load)).max(0.0));
        let own_desired = own.recommend(secs, ready).replicas;
        desired - own_desired.clamp(self.settings.min, desired)
    }

    /// Drains, releases and submits what reconcile asks for `desired`.
    pub(super) async fn act(&mut self, desired: u32, replicas: &[Replica]) -> Result<(), RoundError> {
        let mut errors = Vec::new();
        let headroom = self.headroom(desired, &mut errors).await;
        let s = &self.settings;
        let target = EndpointTarget {
            min: s.min,
            max: s.max,
            desired,
            renew_before: s.startup_timeout + s.drain_timeout + Duration::from_secs(60),
            startup_timeout: s.startup_timeout,
            headroom,
            lower: self.seen.lower,
        };
        let actions = reconcile(&target, replicas);
        if self.settings.advisory {
            self.advise(&actions, replicas, &target);
            return RoundError::all(errors);
        }
        if let Err(e) = self.cancel_surplus().await {
            errors.push(e);
        }
        let mut release = Vec::new();
        for action in &actions {
            match *action {
                Action::Submit(_) => {}
                Action::Drain { job, slot } => {
                    if self.drain(job, slot) {
                        self.decided(DecisionMode::Act, action, replicas, &target);
                    }
                }
                Action::Release { job, slot } => {
                    self.decided(DecisionMode::Act, action, replicas, &target);
                    // What the decision saw, for the day a release cuts
                    // something short.
                    if let Some(r) = replicas.iter().find(|r| (r.job, r.slot) == (job, slot)) {
                        tracing::info!(endpoint = %self.name, job, port = slot, phase = ?r.phase, in_flight = r.in_flight,
                            "releasing a replica's GPUs");
                        if r.phase == Phase::Starting && r.starting_for > self.settings.startup_timeout {
                            let counted =
                                self.tracked.get_mut(&job).map(|t| std::mem::replace(&mut t.failure_counted, true));
                            if counted == Some(false) {
                                let cause = self.never_healthy_cause(job, r.starting_for);
                                self.failed_start(job, cause);
                            }
                        }
                    }
                    release.push((job, slot))
                }
            }
        }
        if let Err(e) = self.release(&release).await {
            errors.push(e);
        }
        if let Err(e) = self.submit_all(&actions, replicas, &target).await {
            errors.push(e);
        }
        RoundError::all(errors)
    }

    /// The warm headroom this round (with `[endpoint.replicas.warm]`).
    async fn headroom(&mut self, desired: u32, errors: &mut Vec<RoundError>) -> Option<Headroom> {
        let s = &self.settings;
        let headroom = match &s.warm {
            None => None,
            Some(w) => {
                let gpus_wanted = match self.gpus_wanted(&w.scope).await {
                    Ok(wanted) => wanted,
                    // Unknown: as if wanted, so that nothing is kept or
                    // added on GPUs somebody may be waiting for.
                    Err(e) => {
                        errors.push(e);
                        true
                    }
                };
                let replicas = w.spec.replicas_above(desired.clamp(s.min, s.max.max(s.min)));
                Some(Headroom { replicas, gpus_wanted })
            }
        };
        let mut v = self.view.lock().unwrap_or_else(|e| e.into_inner());
        v.headroom = headroom.map(|h| h.replicas);
        v.gpus_wanted = headroom.map(|h| h.gpus_wanted);
        headroom
    }

    /// The submissions reconcile asked for, as the start back-off allows.
    async fn submit_all(
        &mut self,
        actions: &[Action],
        replicas: &[Replica],
        target: &EndpointTarget,
    ) -> Result<(), RoundError> {
        let submissions = pack_submissions(actions, self.settings.replicas_per_job);
        let unproven = self.tracked.values().filter(|t| t.served_at.is_none() && !t.failure_counted).count();
        let now = self.since_start(Instant::now());
        let allowed = match self.backoff.allowance(now, unproven) {
            Allowance::Any => submissions.len(),
            Allowance::One => 1,
            Allowance::None { .. } => 0,
        };
        if allowed < submissions.len() {
            tracing::debug!(endpoint = %self.name, wanted = submissions.len(), allowed, "start back-off holds submissions");
        }
        for (kind, n) in submissions.into_iter().take(allowed) {
            // A probe is one replica, whatever the job could host.
            let n = if self.backoff.active() { 1 } else { n };
            match self.submit(kind, n).await {
                Ok(true) => self.decided(DecisionMode::Act, &Action::Submit(kind), replicas, target),
                Ok(false) => {}
                Err(e) => {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Whether a pending job in the pool, other than a warm replica, waits
    /// for nodes or GPUs (one squeue, shared by the endpoints).
    pub(super) async fn gpus_wanted(&self, scope: &crate::config::PoolScope) -> Result<bool, RoundError> {
        let (slurm, parts) = (self.slurm.clone(), scope.partitions.clone());
        let waiting = blocking(&self.metrics, &self.name, "squeue_pending", move || slurm.waiting(&parts)).await?;
        Ok(waiting.iter().any(|w| w.wants_resources() && !scope.warm_qos.contains(&w.qos)))
    }

    /// What the autoscaler sees: requests queued in the router plus each
    /// replica's load, from its own metrics where configured and readable,
    /// else the router's count of its requests in flight.
    pub(super) async fn load(&self, snap: &EndpointSnapshot) -> (f64, Option<(usize, usize)>) {
        let queued = snap.queued as f64;
        let Some(client) = &self.scraper else {
            return (queued + f64::from(snap.replicas.iter().map(|r| r.in_flight).sum::<u32>()), None);
        };
        let serving: Vec<_> = snap.replicas.iter().filter(|r| r.state == ReplicaState::Ready).collect();
        let mut reads = tokio::task::JoinSet::new();
        for (i, r) in serving.iter().enumerate() {
            let (client, address) = (client.clone(), r.address);
            let Some(conns) = self.endpoint.conns_of(address) else { continue };
            let (path, names) = (self.settings.metrics_path.clone(), self.settings.load_metrics.clone());
            reads.spawn(
                async move { (i, crate::replica_metrics::scrape(&client, &conns, address, &path, &names).await) },
            );
        }
        let mut own = vec![None; serving.len()];
        while let Some(Ok((i, r))) = reads.join_next().await {
            match r {
                Ok(v) => own[i] = Some(v),
                Err(e) => tracing::debug!(endpoint = %self.name, "replica load metrics: {e}"),
            }
        }
        let ok = own.iter().filter(|v| v.is_some()).count();
        let mut load = queued;
        for r in &snap.replicas {
            let i = serving.iter().position(|s| s.address == r.address);
            load += i.and_then(|i| own[i]).unwrap_or(f64::from(r.in_flight));
        }
        (load, Some((ok, serving.len())))
    }

    /// The lowest block of `want` port pairs (fewer if no block that large
    /// is free: the job then hosts fewer replicas) that no tracked job
    /// uses. The lowest, not the next in turn (issue #37): two onepoold
    /// instances acting at once with the same view of Slurm then pick the
    /// same slot for the same replica, their jobs share a name, and Slurm's
    /// singleton dependency holds the second; slots taken in turn would
    /// differ between them and both jobs would run. Reusing a slot costs
    /// nothing since the slot became a name only (issue #25: the launcher
    /// listens where the kernel says), and a job that still runs under
    /// that name holds the new one back.
    pub(super) fn free_ports(&self, want: u32) -> Option<(u16, u32)> {
        let (lo, hi) = self.settings.port_range;
        let ports = u32::from(hi) - u32::from(lo) + 1;
        let pairs = ports / 2;
        let free = |p: u32| {
            let port = lo + (2 * p) as u16;
            !self.tracked.values().any(|t| t.uses(port) || t.uses(port + 1)) && !self.named_slots.contains(&port)
        };
        for n in (1..=want.max(1)).rev() {
            if let Some(i) = (0..pairs).find(|i| i + n <= pairs && (*i..*i + n).all(free)) {
                return Some((lo + (2 * i) as u16, n));
            }
        }
        None
    }

    /// Jobs that must go because another job holds their slot (the same
    /// name): two onepoold instances acting at once, or one that submitted
    /// and lost its state before it saw the job. Slurm's singleton
    /// dependency lets one job of a name run at a time, so of several jobs
    /// in one slot the one to keep is the one running, else the lowest id
    /// (the one Slurm starts first); every other pending one waits on it
    /// for nothing and is cancelled. A running job is never cancelled for
    /// this alone: it may serve, and two running in one slot (jobs
    /// submitted without the dependency) are left to scale-down. Every
    /// instance with the same view picks the same jobs, so they never
    /// cancel each other's keeper. A job counted here may have started
    /// since the poll only if its slot's keeper ended meanwhile: then it
    /// is loading its model, not serving.
    pub(super) fn surplus_in_slots(&self) -> Vec<u32> {
        let mut by_slot: BTreeMap<u16, Vec<(u32, bool)>> = BTreeMap::new();
        for (id, t) in &self.tracked {
            // Released already (scancel went through): not a holder.
            if !t.members.is_empty() && t.members.values().all(|m| m.released) {
                continue;
            }
            by_slot.entry(t.base_port).or_default().push((*id, t.running));
        }
        let mut surplus = Vec::new();
        for jobs in by_slot.values().filter(|j| j.len() > 1) {
            // `tracked` is ordered by job id: the first pending one is the oldest.
            let running = jobs.iter().any(|(_, r)| *r);
            let keep = if running { None } else { jobs.first().map(|(id, _)| *id) };
            surplus.extend(jobs.iter().filter(|(id, r)| !r && Some(*id) != keep).map(|(id, _)| *id));
        }
        surplus
    }

    /// Cancels the jobs [`Controller::surplus_in_slots`] finds.
    async fn cancel_surplus(&mut self) -> Result<(), RoundError> {
        let mut errors = Vec::new();
        for job in self.surplus_in_slots() {
            let port = self.tracked.get(&job).map(|t| t.base_port);
            tracing::warn!(endpoint = %self.name, job, port,
                "another replica job holds this one's slot: cancelling this pending one \
                 (another onepoold acts on this endpoint, or one submitted it and lost its state)");
            if let Err(e) = self.cancel(job).await {
                errors.push(e);
            }
        }
        RoundError::all(errors)
    }

    /// Submits a replica job hosting `replicas`; false: held back after
    /// a refused submission.
    pub(super) async fn submit(&mut self, kind: Kind, replicas: u32) -> Result<bool, RoundError> {
        if self.submit_after.is_some_and(|t| Instant::now() < t) {
            return Ok(false);
        }
        let (port, replicas) = self.free_ports(replicas).ok_or(RoundError::NoFreePorts)?;
        // The fence: never on a stale belief that this instance acts.
        if !self.leadership.may_act() {
            return Err(RoundError::NotActing);
        }
        let args = sbatch_args(&self.name, &self.settings, kind, port, replicas);
        let slurm = self.slurm.clone();
        let r = blocking(&self.metrics, &self.name, "sbatch", move || {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            slurm.submit(&a)
        })
        .await;
        match r {
            Ok(job) => {
                tracing::info!(endpoint = %self.name, job, port, replicas, ?kind, "submitted a replica job");
                let mut t = TrackedJob::new(port, kind, replicas as u16);
                let n = if self.per_node() { replicas as usize } else { 1 };
                for p in (0..n).filter_map(|i| onepool_launcher::replica_group::port_of(port, i)) {
                    t.members.insert(p, Member::default());
                }
                self.tracked.insert(job, t);
                self.view.lock().unwrap_or_else(|e| e.into_inner()).submitted.push(job);
                Ok(true)
            }
            Err(e) => {
                // Do not hammer slurmctld with a submission it refuses.
                self.submit_after = Some(Instant::now() + self.settings.poll_interval.max(Duration::from_secs(1)) * 5);
                Err(e.during(format!("submitting a {kind:?} replica job")))
            }
        }
    }

    /// Out of the router at once; reconcile releases it once nothing is in
    /// flight (or the drain timeout passed). False: it was draining already.
    pub(super) fn drain(&mut self, job: u32, port: u16) -> bool {
        let Some(m) = self.tracked.get_mut(&job).and_then(|t| t.members.get_mut(&port)) else { return false };
        if m.drain_started.is_some() || m.released || !self.leadership.may_act() {
            return false;
        }
        m.drain_started = Some(Instant::now());
        m.drain_started_unix = Some(unix_now());
        tracing::info!(endpoint = %self.name, job, port, node = ?m.node, "draining a replica");
        if let Some(address) = m.address {
            let endpoint = self.endpoint.clone();
            let deadline = self.settings.drain_timeout;
            tokio::spawn(async move {
                let _ = endpoint.drain(address, deadline).await;
            });
        }
        true
    }

    /// Gives the GPUs of drained (or never serving) replicas back:
    /// scancel a job none of whose replicas is left, shrink a running one
    /// to its other nodes, ask a pending one for fewer nodes.
    pub(super) async fn release(&mut self, release: &[(u32, u16)]) -> Result<(), RoundError> {
        if release.is_empty() {
            return Ok(());
        }
        let layouts: Vec<JobLayout> = self
            .tracked
            .iter()
            .filter(|(id, _)| release.iter().any(|(j, _)| j == *id))
            .map(|(id, t)| JobLayout {
                job: *id,
                pending: !t.running,
                batch_host: t.batch_host.clone(),
                replicas: t.members.iter().filter(|(_, m)| !m.released).map(|(p, m)| (*p, m.node.clone())).collect(),
            })
            .collect();
        let mut errors = Vec::new();
        for plan in plan_releases(&layouts, release) {
            let r = match plan {
                Release::Cancel { job } => self.cancel(job).await,
                Release::Shrink { job, keep, released } => {
                    let list = keep.join(",");
                    self.update(job, "NodeList", list, &released, "released its node").await
                }
                Release::Resize { job, nodes, released } => {
                    self.update(job, "NumNodes", nodes.to_string(), &released, "asks for fewer nodes").await
                }
                Release::Held { job, slot } => {
                    tracing::debug!(endpoint = %self.name, job, port = slot, "drained replica on the batch host waits for the rest of its job");
                    Ok(())
                }
            };
            if let Err(e) = r {
                errors.push(e);
            }
        }
        RoundError::all(errors)
    }

    /// `scontrol update JobId=job key=value`, then the `released` replicas
    /// are out of the router for good.
    pub(super) async fn update(
        &mut self,
        job: u32,
        key: &'static str,
        value: String,
        released: &[u16],
        what: &str,
    ) -> Result<(), RoundError> {
        if !self.leadership.may_act() {
            return Err(RoundError::NotActing);
        }
        let slurm = self.slurm.clone();
        let v = value.clone();
        let r =
            blocking(&self.metrics, &self.name, "scontrol_update", move || slurm.update_job(job, &[(key, v.as_str())]))
                .await;
        let Some(t) = self.tracked.get_mut(&job) else { return Ok(()) };
        match r {
            Ok(()) => {
                for port in released {
                    if let Some(m) = t.members.get_mut(port) {
                        Self::unroute(&self.endpoint, m);
                        m.released = true;
                        tracing::info!(endpoint = %self.name, job, port, node = ?m.node, "{key}={value}: replica {what}");
                        if let (true, Some(n)) = (key == "NodeList", m.node.clone()) {
                            self.view.lock().unwrap_or_else(|e| e.into_inner()).shrunk.push((job, n));
                        }
                    }
                }
                if key == "NumNodes" {
                    // Placeholders: the next poll lays them out anew.
                    t.members.retain(|p, _| !released.contains(p));
                }
                Ok(())
            }
            Err(e) => Err(e.during(format!("scontrol update JobId={job} {key}={value}"))),
        }
    }

    pub(super) async fn cancel(&mut self, job: u32) -> Result<(), RoundError> {
        if !self.leadership.may_act() {
            return Err(RoundError::NotActing);
        }
        let Some(t) = self.tracked.get_mut(&job) else { return Ok(()) };
        for m in t.members.values_mut() {
            Self::unroute(&self.endpoint, m);
            // Never back into the router, whatever scancel says.
            m.drain_started.get_or_insert_with(Instant::now);
            m.drain_started_unix.get_or_insert_with(unix_now);
        }
        let slurm = self.slurm.clone();
        let r = blocking(&self.metrics, &self.name, "scancel", move || slurm.cancel(job, None)).await;
        if let (Ok(()), Some(t)) = (&r, self.tracked.get_mut(&job)) {
            t.members.values_mut().for_each(|m| m.released = true);
        }
        match r {
            Ok(()) => {
                tracing::info!(endpoint = %self.name, job, "cancelled a replica job");
                Ok(())
            }
            Err(e) => Err(e.during(format!("cancelling replica job {job}"))),
        }
    }
}

/// The lower request classes' part of `load`, by the router's counts of
/// each class waiting and in flight. The replicas' own load metrics, when
/// scraped, count every class alike: their load is split in the same
/// proportion.
pub(super) fn lower_part(classes: &[onepool_control::api::ClassState], load: f64) -> f64 {
    let of = |lower: bool| -> f64 {
        classes.iter().filter(|c| c.lower == lower).map(|c| c.queued as f64 + f64::from(c.in_flight)).sum()
    };
    let (lower, all) = (of(true), of(true) + of(false));
    if all > 0.0 {
        load * lower / all
    } else {
        0.0
    }
}
