//! What the replica side and onepoold agree on without linking each
//! other's code: the status header of a draining replica (the launcher
//! sends it, the router's proxy reads it), the replica job's name with its
//! slot, the key that proves a request comes from onepoold's router, and
//! the note a replica leaves in its job's `Comment` (where it listens, why
//! it ended). A per-node job's step names are [`crate::replica_group`]'s.

/// The launcher's answer while a replica drains: 503 with this header set
/// to "1". The request was not processed, so it is always retried.
pub const DRAINING_HEADER: &str = "x-onepool-draining";

/// The launcher's answer when its model server failed a request before
/// answering it (the connection reset, the process died): 502 with this
/// header set to "1". Nothing of an answer was sent, so the router sends
/// the request whole to another replica rather than pass the 502 on
/// (issue #50); a 502 without it is the model server's own answer.
pub const SERVER_FAILED_HEADER: &str = "x-onepool-server-failed";

/// The header that carries onepoold's replica key on every request the
/// router, its health checks and its metrics reads send to a launcher. The
/// launcher answers nothing without it (issue #25: the launcher's port is
/// in `squeue` for every user to see, and the replica used to answer
/// anyone who found it).
pub const REPLICA_KEY_HEADER: &str = "x-onepool-replica-key";

/// Set to "1" by the router on a request whose answer it can continue on
/// another replica (issue #43): a graceful drain ends such a stream at
/// once (with the reclaim event the router reads as "move it") instead of
/// waiting for it, and such a request may use the model server's
/// continuation paths ([`crate::access::CONTINUATION_PATHS`]). The router
/// never passes a client's own `x-onepool-*` fields, and the launcher
/// reads this one only on a request that carries the replica key.
pub const MOVABLE_HEADER: &str = "x-onepool-movable";

/// The environment variable that hands the replica key from onepoold to
/// the launcher, through sbatch and the job's environment: a job's
/// environment is readable by its own user and root only (`scontrol show
/// job` does not print it; `/proc/PID/environ` is private to the uid),
/// unlike a command line. The launcher takes it out of its environment
/// before it starts the model server.
pub const REPLICA_KEY_ENV: &str = "ONEPOOL_REPLICA_KEY";

/// What onepoold hands its replica jobs instead of the key itself: its
/// SHA-256 (64 hex digits), enough for the launcher to check a request's
/// key. A job's environment crosses the cluster network in clear, in
/// sbatch's request to slurmctld and in slurmctld's launch of the batch
/// script on the node (Slurm's RPCs are signed by munge, not encrypted:
/// measured on the hosts-mode bridge, issue #36), so the key itself would
/// reach anyone who can capture there. The digest does not give the key
/// back, and over TLS the key travels encrypted only.
pub const REPLICA_KEY_DIGEST_ENV: &str = "ONEPOOL_REPLICA_KEY_SHA256";

/// The model server's own key, made by the launcher at each start: the
/// launcher sends it as `Authorization: Bearer KEY`, so another process on
/// the node that finds the server's loopback port gets nothing from it.
/// Set under this name, and under the names llama-server and vLLM read
/// their `--api-key` from ([`BACKEND_KEY_ALIASES`]).
pub const BACKEND_KEY_ENV: &str = "ONEPOOL_BACKEND_API_KEY";
pub const BACKEND_KEY_ALIASES: [&str; 2] = ["LLAMA_API_KEY", "VLLM_API_KEY"];

/// The replica job's name: its slot (a number onepoold gives each replica
/// job, from `port_range`) is part of it. Since issue #25 the slot is not
/// the port the replica listens on: that one the kernel chooses on the
/// node, and the launcher reports it in the job's [`ReplicaNote`].
pub fn job_name(endpoint: &str, slot: u16) -> String {
    format!("onepool-{endpoint}-{slot}")
}

/// The slot encoded in a replica job's name, if the name is this endpoint's.
pub fn port_from_name(endpoint: &str, name: &str) -> Option<u16> {
    let port = name.strip_prefix("onepool-")?.strip_prefix(endpoint)?.strip_prefix('-')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse().ok()
}

/// What a replica job's launcher(s) write into the job's `Comment`
/// (`scontrol update JobId=.. Comment=..`): the port each replica listens
/// on and, once a server ended by itself, why. Only the job's own user
/// (onepoold's) and Slurm's administrators can set a job's comment, and
/// onepoold reads it only from jobs it owns (uid and job_submit/onepool's
/// record), so the address cannot be planted by another user the way a
/// fixed port could be taken.
///
/// Since issue #26 the note is also the record of a graceful reclaim: a
/// launcher that drained on a notice adds what the drain did, and with
/// `AccountingStoreFlags=job_comment` slurmdbd keeps the comment, so
/// `onepool report` finds it in `sacct` after the job is gone (a drained
/// replica ends COMPLETED, like one that was never reclaimed).
///
/// Since issue #36 it also carries the fingerprint of each replica's TLS
/// certificate (`F<slot>`, [`crate::hop_tls`]), which the router pins: the
/// comment is where onepoold learns the address, so the same few writers
/// vouch for both.
///
/// Text form: `op1;L<slot>=<port>;F<slot>=<sha256 hex>;E<slot>=<cause>;D<slot>=<drain>`, the
/// cause percent-encoded (no spaces: `scontrol -o show job` prints the
/// comment among other `Key=Value` words), the drain as
/// [`DrainNote::encode`]. Bounded to [`NOTE_MAX`] bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaNote {
    /// (slot, port) of each replica that listens.
    pub listening: Vec<(u16, u16)>,
    /// (slot, certificate fingerprint) of each replica that serves TLS.
    pub pins: Vec<(u16, Fingerprint)>,
    /// (slot, cause) of each replica whose server ended by itself.
    pub ended: Vec<(u16, String)>,
    /// (slot, drain) of each replica that drained on a notice.
    pub drained: Vec<(u16, DrainNote)>,
}

/// What a replica's drain did, from the notice to its end.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DrainNote {
    /// When the notice came, in milliseconds since the Unix epoch.
    pub notice_ms: u64,
    /// The notice: 10 (SIGUSR1: Slurm's preemption notice as onepoold asks
    /// for it), 15 (SIGTERM: scancel, a plain GraceTime), 23 (SIGURG: a
    /// per-node job's step), 2 (SIGINT).
    pub signal: i32,
    /// Requests in flight at the notice.
    pub in_flight: u64,
    /// Of those, the ones the drain timeout cut off.
    pub cut: u64,
    /// Of those, the streams ended at once for the router to continue on
    /// another replica (issue #43; 0 in notes written before it).
    pub moved: u64,
    /// New requests answered "draining" (the router sent them elsewhere).
    pub turned_away: u64,
    /// From the notice to the end of the drain, in milliseconds.
    pub took_ms: u64,
}

impl DrainNote {
    /// Whether the drain began on Slurm's notice as onepoold asks for it
    /// (`--signal=B:USR1@N`: preemption, or the time limit near), not on a
    /// scancel (SIGTERM).
    pub fn on_slurm_notice(&self) -> bool {
        self.signal == libc::SIGUSR1
    }

    /// The requests in flight at the notice that finished here.
    pub fn finished(&self) -> u64 {
        self.in_flight.saturating_sub(self.cut).saturating_sub(self.moved)
    }

    /// `notice_ms,signal,in_flight,cut,turned_away,took_ms,moved`.
    pub fn encode(&self) -> String {
        format!(
            "{},{},{},{},{},{},{}",
            self.notice_ms, self.signal, self.in_flight, self.cut, self.turned_away, self.took_ms, self.moved
        )
    }

    /// A note of either form (six fields before issue #43, seven since).
    pub fn decode(text: &str) -> Option<DrainNote> {
        let f: Vec<u64> = text.split(',').map(|x| x.parse().ok()).collect::<Option<_>>()?;
        let (notice_ms, signal, in_flight, cut, turned_away, took_ms, moved) = match f[..] {
            [a, b, c, d, e, g] => (a, b, c, d, e, g, 0),
            [a, b, c, d, e, g, h] => (a, b, c, d, e, g, h),
            _ => return None,
        };
        let d =
            DrainNote { notice_ms, signal: i32::try_from(signal).ok()?, in_flight, cut, moved, turned_away, took_ms };
        (d.cut.saturating_add(d.moved) <= d.in_flight).then_some(d)
    }
}

/// The longest note written; causes are shortened (their last lines kept)
/// to fit. slurmctld refuses a longer comment whole (`_test_strlen`:
/// "strlen(comment) too big (1500 > 1024)" in 22.05's log, where a note of
/// 1500 bytes, a server's end with its output, was lost with its cause).
pub const NOTE_MAX: usize = 1024;

const NOTE_TAG: &str = "op1";

impl ReplicaNote {
    pub fn port(&self, slot: u16) -> Option<u16> {
        self.listening.iter().find(|(s, _)| *s == slot).map(|(_, p)| *p)
    }

    /// The fingerprint of the certificate the replica in `slot` serves.
    pub fn pin(&self, slot: u16) -> Option<Fingerprint> {
        self.pins.iter().find(|(s, _)| *s == slot).map(|(_, f)| *f)
    }

    pub fn set_pin(&mut self, slot: u16, pin: Fingerprint) {
        self.pins.retain(|(s, _)| *s != slot);
        self.pins.push((slot, pin));
    }

    pub fn ended(&self, slot: u16) -> Option<&str> {
        self.ended.iter().find(|(s, _)| *s == slot).map(|(_, c)| c.as_str())
    }

    pub fn set_port(&mut self, slot: u16, port: u16) {
        self.listening.retain(|(s, _)| *s != slot);
        self.listening.push((slot, port));
    }

    pub fn set_ended(&mut self, slot: u16, cause: &str) {
        self.ended.retain(|(s, _)| *s != slot);
        self.ended.push((slot, cause.to_string()));
    }

    pub fn set_drained(&mut self, slot: u16, drain: DrainNote) {
        self.drained.retain(|(s, _)| *s != slot);
        self.drained.push((slot, drain));
    }

    /// The comment's text; causes are cut from their start (the last lines
    /// of a server's output say most) until the whole fits [`NOTE_MAX`].
    pub fn encode(&self) -> String {
        let mut out = String::from(NOTE_TAG);
        for (slot, port) in &self.listening {
            out.push_str(&format!(";L{slot}={port}"));
        }
        for (slot, pin) in &self.pins {
            out.push_str(&format!(";F{slot}={pin}"));
        }
        // Before the causes: they are cut to fit, these never are.
        for (slot, drain) in &self.drained {
            out.push_str(&format!(";D{slot}={}", drain.encode()));
        }
        let causes = self.ended.len().max(1);
        let room = NOTE_MAX.saturating_sub(out.len()) / causes;
        for (slot, cause) in &self.ended {
            let head = format!(";E{slot}=");
            let budget = room.saturating_sub(head.len());
            let mut enc = percent_encode(cause);
            if enc.len() > budget {
                // Keep the end; cut at an escape's start.
                let mut cut = enc.len() - budget;
                while cut < enc.len() && !is_boundary(&enc, cut) {
                    cut += 1;
                }
                enc = enc[cut..].to_string();
            }
            out.push_str(&head);
            out.push_str(&enc);
        }
        out
    }

    /// The note in a job's comment; `None` for a comment that is not one
    /// (empty, a user's own text, another program's).
    pub fn decode(comment: &str) -> Option<ReplicaNote> {
        let mut parts = comment.trim().split(';');
        if parts.next()? != NOTE_TAG {
            return None;
        }
        let mut note = ReplicaNote::default();
        for part in parts {
            let (key, value) = part.split_at_checked(1)?;
            let (slot, value) = value.split_once('=')?;
            let slot: u16 = slot.parse().ok()?;
            match key {
                "L" => note.set_port(slot, value.parse().ok().filter(|p| *p != 0)?),
                "F" => note.set_pin(slot, value.parse().ok()?),
                "E" => note.set_ended(slot, &percent_decode(value)),
                "D" => note.set_drained(slot, DrainNote::decode(value)?),
                // A newer launcher's entries: skipped, not refused.
                _ => {}
            }
        }
        Some(note)
    }
}

/// Whether `at` starts a character of the encoded text (not inside `%XX`).
fn is_boundary(enc: &str, at: usize) -> bool {
    let b = enc.as_bytes();
    !(at >= 1 && b[at - 1] == b'%' || at >= 2 && b[at - 2] == b'%')
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.:/()[]@+,".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

use crate::hop_tls::Fingerprint;

/// The lines a per-node job's launcher steps print on their standard
/// output for the job's main process ([`crate::replica_group`]), which
/// alone writes the job's comment (several writers would race).
pub const STEP_LINE: &str = "onepool-replica-note ";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_slot_and_only_this_endpoint_s_parse() {
        assert_eq!(job_name("llm", 18000), "onepool-llm-18000");
        assert_eq!(port_from_name("llm", "onepool-llm-18000"), Some(18000));
        assert_eq!(port_from_name("llm-2", "onepool-llm-2-18000"), Some(18000));
        assert_eq!(port_from_name("llm", "onepool-llm-2-18000"), None);
        assert_eq!(port_from_name("llm", "onepool-llm-+18000"), None);
        assert_eq!(port_from_name("llm", "onepool-llm-"), None);
        assert_eq!(port_from_name("llm", "other-llm-18000"), None);
    }

    #[test]
    fn a_note_round_trips_and_has_no_spaces() {
        let mut n = ReplicaNote::default();
        n.set_port(19400, 41234);
        n.set_port(19402, 40001);
        n.set_ended(19400, "killed by SIGSEGV (core dumped); last output:\nggml_backend_amx_mul_mat: 100% ;=");
        let pin = Fingerprint([0xab; 32]);
        n.set_pin(19402, pin);
        let text = n.encode();
        assert!(!text.contains(' ') && !text.contains('\n'), "{text}");
        assert_eq!(ReplicaNote::decode(&text), Some(n.clone()));
        assert_eq!(n.port(19402), Some(40001));
        assert_eq!(n.pin(19402), Some(pin));
        assert_eq!(n.pin(19400), None);
        assert!(text.contains(&format!(";F19402={}", "ab".repeat(32))), "{text}");
        assert!(n.ended(19400).unwrap().ends_with("100% ;="));
    }

    #[test]
    fn a_drain_round_trips_before_the_causes_and_survives_their_cut() {
        let mut n = ReplicaNote::default();
        n.set_port(7, 40000);
        let d = DrainNote {
            notice_ms: 1_796_000_000_123,
            signal: 10,
            in_flight: 5,
            cut: 1,
            moved: 2,
            turned_away: 9,
            took_ms: 2500,
        };
        n.set_drained(7, d);
        n.set_ended(7, &"x".repeat(3 * NOTE_MAX));
        let text = n.encode();
        assert!(text.len() <= NOTE_MAX, "{}", text.len());
        assert!(text.starts_with("op1;L7=40000;D7=1796000000123,10,5,1,9,2500,2;E7="), "{text}");
        let back = ReplicaNote::decode(&text).unwrap();
        assert_eq!(back.drained, [(7, d)]);
        assert_eq!(d.finished(), 2);
        // A note from before streams moved reads with none moved.
        let old = ReplicaNote::decode("op1;D7=1796000000123,10,5,1,9,2500").unwrap();
        assert_eq!(old.drained, [(7, DrainNote { moved: 0, ..d })]);
        // Cut and moved cannot pass what was in flight; every field is needed.
        for bad in [
            "op1;D1=1,10,2,3,0,5",
            "op1;D1=1,10,2",
            "op1;D1=a,10,2,1,0,5",
            "op1;D1=1,10,2,1,0,5,6",
            "op1;D1=1,10,2,1,0,5,0,0",
        ] {
            let parsed = ReplicaNote::decode(bad);
            assert!(parsed.is_none() || parsed.unwrap().drained.is_empty(), "{bad}");
        }
    }

    #[test]
    fn a_comment_that_is_not_a_note_is_none() {
        // A fingerprint that is not one makes no note: onepoold must not
        // route to a replica whose certificate it cannot pin.
        let short = format!("op1;L1=2;F1={}", "ab".repeat(31));
        let upper = format!("op1;L1=2;F1={}", "AB".repeat(32));
        for c in ["", "my comment", "op1;Lx=1", "op1;L1=0", "op2;L1=2", "op1;L1", &short, &upper, "op1;L1=2;F1="] {
            assert_eq!(ReplicaNote::decode(c), None, "{c:?}");
        }
        // Unknown entries of a newer launcher are skipped.
        assert_eq!(ReplicaNote::decode("op1;L1=2;X5=y").unwrap().listening, [(1, 2)]);
    }

    #[test]
    fn a_long_cause_keeps_its_end_within_the_bound() {
        let mut n = ReplicaNote::default();
        n.set_port(1, 2);
        let cause = format!("start {} END", "é%".repeat(2000));
        n.set_ended(1, &cause);
        let text = n.encode();
        assert!(text.len() <= NOTE_MAX, "{}", text.len());
        let back = ReplicaNote::decode(&text).unwrap();
        assert!(back.ended(1).unwrap().ends_with(" END"));
        assert!(!back.ended(1).unwrap().contains('\u{FFFD}') || back.ended(1).unwrap().starts_with('\u{FFFD}'));
    }
}
