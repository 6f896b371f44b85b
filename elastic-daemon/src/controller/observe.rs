//! Reading Slurm: the endpoint's replica jobs, their records and notes, and
//! the router kept in step with them.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use onepool_decisions::replicas::Kind;
use onepool_launcher::conventions::{port_from_name, ReplicaNote};
use onepool_launcher::replica_group::port_from_step_name;
use onepool_router::backend_pool::Transport;
use onepool_router::endpoint::Endpoint;
use onepool_router::registry::RegistryError;
use onepool_slurm_commands::state::JobInfo;

use crate::config::ReplicaTransport;
use crate::controller::sbatch::owned;
use crate::controller::tracked::{job_nodes, live, EndedJob, Live, Member, TrackedJob};
use crate::controller::{blocking, member_ports, unix_now, Controller};
use crate::round_error::RoundError;

impl Controller {
    pub(super) fn unroute(endpoint: &Endpoint, m: &mut Member) {
        if let Some(a) = m.address.take() {
            let _ = endpoint.remove(a);
        }
    }

    /// Brings one owned, live job's replicas up to date with what Slurm
    /// says: placeholders while it pends, one replica per node once it runs.
    pub(super) fn observe(&mut self, j: &JobInfo, l: Live, base: u16, kind: Kind, steps: &[(String, u16)]) {
        let per_node = self.per_node();
        let (name, endpoint) = (&self.name, &self.endpoint);
        let t = self.tracked.entry(j.job_id).or_insert_with(|| {
            tracing::info!(endpoint = %name, job = j.job_id, port = base, ?kind, state = %j.job_state, "adopted a replica job");
            TrackedJob::new(base, kind, j.node_count.clamp(1, 256) as u16)
        });
        t.width = t.width.max(j.node_count.clamp(1, 256) as u16);
        if !j.nodes.is_empty() {
            t.nodes.clone_from(&j.nodes);
        }
        // Slurm's kill comes at end_time once it preempts the job. Only
        // shown and logged: the reclaim is counted from the job's record
        // when it ends, which no poll interval can miss.
        let preempt_end = j.is_being_preempted().then_some(j.end_time).filter(|e| *e > 0);
        if let (None, Some(end)) = (t.preempt_end, preempt_end) {
            let left = end.saturating_sub(unix_now());
            tracing::info!(endpoint = %name, job = j.job_id, ?kind, "Slurm is preempting the replica job; it ends within {left} s");
        }
        t.preempt_end = preempt_end;
        let wanted: Vec<(Option<String>, u16)> = match l {
            Live::Pending => {
                if t.running {
                    // Back in the queue (requeued by an admin or after a node
                    // failure): it runs elsewhere next time.
                    tracing::info!(endpoint = %name, job = j.job_id, "replica job is pending again; out of the router");
                }
                let n = if per_node { j.node_count.max(1) as usize } else { 1 };
                (0..n).filter_map(|i| onepool_launcher::replica_group::port_of(base, i)).map(|p| (None, p)).collect()
            }
            Live::Running if j.nodes.is_empty() => return,
            Live::Running if !per_node => {
                let host = if j.batch_host.is_empty() { j.nodes.clone() } else { j.batch_host.clone() };
                vec![(Some(host), base)]
            }
            Live::Running => {
                // Where a step is gone (its server crashed) the replica's
                // port is still the one it had: after a shrink a node's
                // position in the job no longer says which port the
                // launcher gave it.
                let mut known = steps.to_vec();
                for (p, m) in &t.members {
                    if let Some(n) = m.node.as_ref().filter(|n| !known.iter().any(|(k, _)| k == *n)) {
                        known.push((n.clone(), *p));
                    }
                }
                member_ports(base, &job_nodes(j), &known).into_iter().map(|(n, p)| (Some(n), p)).collect()
            }
        };
        t.running = l == Live::Running;
        if !t.running {
            t.seen_running = None;
        } else if t.seen_running.is_none() {
            t.seen_running = Some(Instant::now());
        }
        t.batch_host = Some(j.batch_host.clone()).filter(|b| t.running && !b.is_empty());
        // Replicas whose node left the job (shrink, node failure) or that
        // were placeholders of a pending job go; the rest are kept.
        t.members.retain(|port, m| {
            let keep = wanted.iter().any(|(n, p)| p == port && *n == m.node);
            if !keep {
                Self::unroute(endpoint, m);
            }
            keep
        });
        for (node, port) in wanted {
            let m = t.members.entry(port).or_insert_with(|| Member { node: node.clone(), ..Member::default() });
            if per_node && t.running {
                let has_step = steps.iter().any(|(n, p)| Some(n) == node.as_ref() && *p == port);
                if has_step {
                    m.step_seen = true;
                } else if m.step_seen && !m.ended {
                    m.ended = true;
                    tracing::warn!(endpoint = %name, job = j.job_id, port, node = ?node, "replica step ended; out of the router");
                    Self::unroute(endpoint, m);
                    self.step_ends.push((j.job_id, port));
                }
            }
        }
    }

    /// Fills in job_submit/onepool's record of each job that may be one of
    /// this endpoint's replicas (its uid and name), read from Slurm once
    /// per job: the poll's squeue does not print it, and users cannot
    /// change it afterwards.
    pub(super) async fn read_records(&mut self, jobs: &mut [JobInfo]) -> Result<(), RoundError> {
        self.records.retain(|id, _| jobs.iter().any(|j| j.job_id == *id));
        for j in jobs.iter_mut() {
            if j.user_id != self.uid || port_from_name(&self.name, &j.name).is_none() {
                continue;
            }
            if let Some(c) = self.records.get(&j.job_id) {
                j.admin_comment = c.clone();
                continue;
            }
            let (slurm, id) = (self.slurm.clone(), j.job_id);
            let c = blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.admin_comment(id)).await?;
            j.admin_comment = c.unwrap_or_default();
            self.records.insert(j.job_id, j.admin_comment.clone());
        }
        Ok(())
    }

    /// Reads the comment of running jobs whose replicas' ports are not
    /// known yet: each replica's launcher writes where it listens there
    /// once it has bound its port.
    pub(super) async fn read_notes(&mut self) -> Result<(), RoundError> {
        let want: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(_, t)| t.running)
            .filter(|(_, t)| {
                t.members.iter().any(|(slot, m)| {
                    m.node.is_some()
                        && m.address.is_none()
                        && !m.released
                        && !m.draining()
                        && !t.note.as_ref().is_some_and(|n| self.note_complete(n, *slot))
                })
            })
            .map(|(id, _)| *id)
            .collect();
        for id in want {
            let slurm = self.slurm.clone();
            let d = blocking(&self.metrics, &self.name, "scontrol_show_job", move || slurm.job_details(id)).await?;
            if let (Some(t), Some(note)) = (self.tracked.get_mut(&id), d.and_then(|d| ReplicaNote::decode(&d.comment)))
            {
                // A per-node replica whose server ended before any poll saw
                // its step: the launcher's note is its record.
                for (slot, m) in t.members.iter_mut() {
                    if note.ended(*slot).is_some() && !m.ended && !m.released && m.node.is_some() {
                        m.ended = true;
                        Self::unroute(&self.endpoint, m);
                        self.step_ends.push((id, *slot));
                    }
                }
                t.note = Some(note);
            }
        }
        Ok(())
    }

    /// This daemon's jobs with job_submit/onepool's record; stops replica
    /// control for good when a job it submitted came back without one.
    pub(super) async fn read(&mut self) -> Result<Vec<JobInfo>, RoundError> {
        if let Some(why) = &self.halted {
            return Err(RoundError::Halted(why.clone()));
        }
        let (slurm, uid) = (self.slurm.clone(), self.uid);
        let mut jobs = blocking(&self.metrics, &self.name, "squeue", move || slurm.user_jobs(uid)).await?;
        self.read_records(&mut jobs).await?;
        if let Some(j) = jobs
            .iter()
            .find(|j| self.tracked.contains_key(&j.job_id) && owned(j, &self.name, self.uid, &self.settings).is_none())
        {
            let why = format!(
                "replica control stopped: job {} that onepoold submitted came back without job_submit/onepool's record for endpoint {} (admin comment {:?}); \
                 the plugin is not in JobSubmitPlugins or the policy is in audit mode. Submitting again would repeat this every poll: \
                 fix the cluster, cancel the job (scancel {}) and restart onepoold",
                j.job_id, self.name, j.admin_comment, j.job_id
            );
            tracing::error!(endpoint = %self.name, job = j.job_id, "{why}");
            self.halted = Some(why.clone());
            return Err(RoundError::Halted(why));
        }
        Ok(jobs)
    }

    /// Tracks this endpoint's live replica jobs (and, for per-node jobs,
    /// where each replica runs); jobs that left the queue leave the router.
    pub(super) async fn adopt(&mut self, jobs: Vec<JobInfo>) -> Result<HashMap<u32, (JobInfo, Live)>, RoundError> {
        let mut seen: HashMap<u32, (JobInfo, Live)> = HashMap::new();
        let mut owned_jobs = Vec::new();
        for j in jobs {
            let Some((port, kind)) = owned(&j, &self.name, self.uid, &self.settings) else { continue };
            let Some(l) = live(&j) else { continue };
            owned_jobs.push((j.job_id, port, kind));
            seen.insert(j.job_id, (j, l));
        }
        // Which replica runs where in per-node jobs: their steps' names.
        let mut steps: HashMap<u32, Vec<(String, u16)>> = HashMap::new();
        if self.per_node() && seen.values().any(|(_, l)| *l == Live::Running) {
            let (slurm, uid) = (self.slurm.clone(), self.uid);
            for s in blocking(&self.metrics, &self.name, "squeue_steps", move || slurm.steps(uid)).await? {
                if let (true, Some(port)) = (seen.contains_key(&s.job_id), port_from_step_name(&s.name)) {
                    steps.entry(s.job_id).or_default().push((s.nodes, port));
                }
            }
        }
        for (id, port, kind) in owned_jobs {
            let (j, l) = &seen[&id];
            self.observe(j, *l, port, kind, steps.get(&id).map(Vec::as_slice).unwrap_or(&[]));
        }
        let gone: Vec<u32> = self.tracked.keys().filter(|id| !seen.contains_key(id)).copied().collect();
        for id in gone {
            if let Some(mut t) = self.tracked.remove(&id) {
                for m in t.members.values_mut() {
                    Self::unroute(&self.endpoint, m);
                }
                tracing::info!(endpoint = %self.name, job = id, "replica job ended; out of the router");
                self.ended.push(EndedJob { job: id, tracked: t, reads: 0 });
            }
        }
        self.settle_ended().await;
        Ok(seen)
    }

    /// Whether the note says all the router needs of the replica in `slot`.
    fn note_complete(&self, note: &ReplicaNote, slot: u16) -> bool {
        note.port(slot).is_some() && (self.settings.transport == ReplicaTransport::Plain || note.pin(slot).is_some())
    }

    /// The port of the replica in `slot` and how the router reaches it,
    /// once its note says enough: with `transport = "tls"` the
    /// certificate's fingerprint must come with the port, or the
    /// replica is not routed to (an older launcher, one started without
    /// `--tls`: the key would cross the network in clear).
    pub(super) fn reachable(&self, note: &ReplicaNote, slot: u16) -> Option<(u16, Transport)> {
        let port = note.port(slot)?;
        match self.settings.transport {
            ReplicaTransport::Plain => Some((port, Transport::Plain)),
            ReplicaTransport::Tls => {
                let pin = note.pin(slot)?;
                match onepool_launcher::hop_tls::pinned_client(pin) {
                    Ok(client) => Some((port, Transport::Pinned(client))),
                    Err(e) => {
                        tracing::error!(endpoint = %self.name, slot, "cannot pin the replica's certificate: {e}");
                        None
                    }
                }
            }
        }
    }

    /// Running replicas not yet in the router join it at their node's
    /// address (as "starting" when health checks will bring them in).
    pub(super) async fn route_running(&mut self) -> Result<(), RoundError> {
        // (job, slot, the port its launcher reported and how to reach it, node)
        let this = &*self;
        let need: Vec<(u32, u16, (u16, Transport), String)> = this
            .tracked
            .iter()
            .filter(|(_, t)| t.running)
            .flat_map(|(id, t)| {
                t.members.iter().filter_map(move |(slot, m)| {
                    if m.address.is_some() || m.released || m.draining() {
                        return None;
                    }
                    let node = m.node.clone()?;
                    let port = this.reachable(t.note.as_ref()?, *slot)?;
                    Some((*id, *slot, port, node))
                })
            })
            .collect();
        if need.is_empty() {
            return Ok(());
        }
        let slurm = self.slurm.clone();
        let nodes = blocking(&self.metrics, &self.name, "sinfo", move || slurm.nodes()).await?;
        for (id, slot, (port, transport), host) in need {
            let Some(node) = nodes.iter().find(|n| n.name == host) else { continue };
            let host = if node.address.is_empty() { node.name.as_str() } else { node.address.as_str() };
            let address = match host.parse::<IpAddr>() {
                Ok(ip) => Some(SocketAddr::new(ip, port)),
                Err(_) => tokio::net::lookup_host((host, port)).await.ok().and_then(|mut a| a.next()),
            };
            let Some(address) = address else {
                tracing::warn!(endpoint = %self.name, job = id, host, "cannot resolve the replica's node address");
                continue;
            };
            match self.endpoint.add_with(address, transport, None, !self.health_checked) {
                Ok(_) | Err(RegistryError::Duplicate { .. }) => {
                    tracing::info!(endpoint = %self.name, job = id, %address, "replica running; in the router");
                    // Warm headroom stays idle until the others are full:
                    // Slurm then takes it back without a drain to wait for.
                    // Lower classes' replicas take their requests first
                    // (issue #44): reclaiming them moves little live traffic.
                    match self.tracked.get(&id).map(|t| t.kind) {
                        Some(Kind::Warm) => _ = self.endpoint.set_spill(address, true),
                        Some(Kind::Lower) => _ = self.endpoint.set_lent(address, true),
                        _ => {}
                    }
                    if let Some(m) = self.tracked.get_mut(&id).and_then(|t| t.members.get_mut(&slot)) {
                        m.address = Some(address);
                    }
                }
                Err(e) => tracing::warn!(endpoint = %self.name, job = id, "cannot add the replica: {e}"),
            }
        }
        Ok(())
    }
}
