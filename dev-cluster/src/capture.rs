//! A packet capture on a hosts-mode cluster's bridge (issue #36), read back
//! as TCP byte streams: `tcpdump` writes the packets, and each direction of
//! each connection is put back in sequence order, so that a text split
//! across two segments is still found.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace file (e.g. `/proc/self/fd/9`, opened by the caller's
/// parent) in which the interface to capture is, when it is not in the
/// caller's own.
pub const NETNS_ENV: &str = "ONEPOOL_BRIDGE_NETNS";

/// `tcpdump` writing every packet on one interface to a file.
pub struct Capture {
    child: Child,
    file: PathBuf,
}

impl Capture {
    /// Starts capturing on `interface` (whole packets, no name lookups)
    /// and returns once tcpdump listens.
    pub fn start(interface: &str, file: &Path) -> Result<Capture, String> {
        let _ = std::fs::remove_file(file);
        let stderr = file.with_extension("log");
        let log = std::fs::File::create(&stderr).map_err(|e| format!("{}: {e}", stderr.display()))?;
        // The bridge lives in the machine's own namespace. A caller in a
        // host's namespace (the demo runs on the client host; `ip netns
        // exec` mounts that namespace's /sys) is handed the machine's as
        // an open file, NETNS_ENV (scripts/demo.sh): init's is not
        // readable in every container.
        let mut tcpdump = if Path::new("/sys/class/net").join(interface).exists() {
            Command::new("tcpdump")
        } else if let Some(netns) = std::env::var_os(NETNS_ENV) {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", netns.to_string_lossy())).arg("tcpdump");
            c
        } else {
            return Err(format!("{interface} is not in this network namespace, and {NETNS_ENV} names none it is in"));
        };
        let child = tcpdump
            // Each packet handed over and written as it comes: by default
            // the kernel hands them over in blocks, and what a block held
            // when tcpdump stopped was lost (measured: 285 of 893).
            // A ring of 128 MiB: in immediate mode each packet takes a
            // slot the size of the largest one (64 KiB with offloads), and
            // the default 2 MiB held 32; a burst while tcpdump waited for
            // the CPU overflowed it (CI: 5 of 36936 dropped by the kernel).
            .args(["-i", interface, "-n", "-s", "0", "-B", "131072", "-U", "--immediate-mode", "-w"])
            .arg(file)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("tcpdump (scripts/install-deps.sh installs it): {e}"))?;
        let mut capture = Capture { child, file: file.to_path_buf() };
        let t0 = Instant::now();
        // tcpdump says "listening on" once its socket is bound.
        while !std::fs::read_to_string(&stderr).unwrap_or_default().contains("listening on") {
            if t0.elapsed() > Duration::from_secs(20) || capture.child.try_wait().ok().flatten().is_some() {
                return Err(format!("tcpdump did not start: {}", std::fs::read_to_string(&stderr).unwrap_or_default()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(capture)
    }

    /// Stops tcpdump (SIGINT: it flushes and closes the file) and reads
    /// what it wrote; an error when a packet sent before this call may be
    /// missing from it ([`written_in_full`]).
    pub fn finish(mut self) -> Result<Flows, String> {
        let asked = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
        // What is still on its way to the file gets there first: the file
        // stops growing for a second.
        let size = |f: &Path| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        let mut last = size(&self.file);
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let now = size(&self.file);
            if now == last {
                break;
            }
            last = now;
        }
        let _ = onepool_os::signal(self.child.id(), libc::SIGINT);
        let _ = self.child.wait();
        let log = std::fs::read_to_string(self.file.with_extension("log")).unwrap_or_default();
        let count = |what: &str| {
            log.lines().find(|l| l.ends_with(what)).and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        };
        let counts = Counts {
            captured: count("packets captured"),
            received: count("packets received by filter"),
            dropped: count("packets dropped by kernel"),
        };
        let bytes = std::fs::read(&self.file).map_err(|e| format!("{}: {e}", self.file.display()))?;
        let flows = Flows::from_pcap(&bytes).map_err(|e| format!("{}: {e}", self.file.display()))?;
        written_in_full(counts, flows.last_at, asked).map_err(|e| format!("{e}: {log}"))?;
        Ok(flows)
    }
}

/// What tcpdump says it did, at its end.
#[derive(Debug, Clone, Copy)]
struct Counts {
    captured: Option<u64>,
    received: Option<u64>,
    dropped: Option<u64>,
}

/// Whether every packet that crossed the interface before `until` (the
/// caller's traffic was over then) is in the file. The kernel drops none
/// (a drop could be anywhere); packets it still held when tcpdump stopped
/// are not written, and they are the newest (tcpdump reads them in the
/// order they came), so the file is whole up to its last packet: that
/// must be stamped `until` or later. Packets keep crossing a live
/// cluster's bridge, so a few always arrive as tcpdump stops (CI: 5 of
/// 36936 in the demo).
fn written_in_full(c: Counts, last_at: Option<f64>, until: f64) -> Result<(), String> {
    let (Some(captured), Some(received)) = (c.captured, c.received) else {
        return Err("tcpdump did not say how many packets it captured and received".into());
    };
    if c.dropped != Some(0) {
        return Err(format!("the kernel dropped {:?} packets of the capture", c.dropped));
    }
    if captured < received && last_at.is_none_or(|t| t < until) {
        return Err(format!(
            "tcpdump wrote {captured} of the {received} packets it received, the last stamped {last_at:?}, before \
             the traffic ended at {until:.3}: packets sent before then may be missing"
        ));
    }
    Ok(())
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One direction of one TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Flow {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
}

/// Every TCP payload byte in a capture, by flow, in sequence order.
#[derive(Debug, Default)]
pub struct Flows {
    pub packets: usize,
    /// The last packet's time stamp (seconds since the epoch).
    pub last_at: Option<f64>,
    pub streams: BTreeMap<Flow, Vec<u8>>,
}

impl Flows {
    /// Reads a classic pcap file of Ethernet frames (what tcpdump -w
    /// writes for a bridge); IPv4 TCP only, the rest counted and skipped.
    pub fn from_pcap(b: &[u8]) -> Result<Flows, String> {
        if b.len() < 24 {
            return Err(format!("{} bytes: no pcap header", b.len()));
        }
        let le = match &b[..4] {
            [0xd4, 0xc3, 0xb2, 0xa1] | [0x4d, 0x3c, 0xb2, 0xa1] => true,
            [0xa1, 0xb2, 0xc3, 0xd4] | [0xa1, 0xb2, 0x3c, 0x4d] => false,
            m => return Err(format!("not a pcap file (magic {m:02x?})")),
        };
        let u32_at = |i: usize| {
            let w = [b[i], b[i + 1], b[i + 2], b[i + 3]];
            if le {
                u32::from_le_bytes(w)
            } else {
                u32::from_be_bytes(w)
            }
        };
        if u32_at(20) != 1 {
            return Err(format!("link type {} is not Ethernet", u32_at(20)));
        }
        // The second word of a stamp: microseconds, or nanoseconds (the
        // magic says which).
        let fraction = if matches!(&b[..4], [0x4d, 0x3c, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d]) { 1e9 } else { 1e6 };
        // (seq, payload) by flow; put in order below.
        let mut segments: BTreeMap<Flow, Vec<(u32, Vec<u8>)>> = BTreeMap::new();
        let mut flows = Flows::default();
        let mut i = 24;
        while i + 16 <= b.len() {
            let len = u32_at(i + 8) as usize;
            let frame = b.get(i + 16..i + 16 + len).ok_or("a packet runs past the end of the file")?;
            flows.last_at = Some(f64::from(u32_at(i)) + f64::from(u32_at(i + 4)) / fraction);
            i += 16 + len;
            flows.packets += 1;
            if let Some((flow, seq, payload)) = tcp_payload(frame) {
                if !payload.is_empty() {
                    segments.entry(flow).or_default().push((seq, payload.to_vec()));
                }
            }
        }
        for (flow, mut segs) in segments {
            // Wrapping sequence numbers ordered by their signed distance
            // from the first one seen (a segment sent before it but
            // captured after is behind it, not 4 GiB ahead); a
            // retransmission (same start) is kept once.
            let first = segs[0].0;
            segs.sort_by_key(|(seq, _)| seq.wrapping_sub(first) as i32);
            segs.dedup_by_key(|(seq, _)| *seq);
            flows.streams.insert(flow, segs.into_iter().flat_map(|(_, p)| p).collect());
        }
        Ok(flows)
    }

    /// The flows whose bytes contain `needle`.
    pub fn containing(&self, needle: &[u8]) -> Vec<Flow> {
        self.streams.iter().filter(|(_, s)| contains(s, needle)).map(|(f, _)| *f).collect()
    }

    /// Payload bytes sent to `to`.
    pub fn bytes_to(&self, to: SocketAddrV4) -> usize {
        self.streams.iter().filter(|(f, _)| f.to == to).map(|(_, s)| s.len()).sum()
    }
}

fn tcp_payload(frame: &[u8]) -> Option<(Flow, u32, &[u8])> {
    // Ethernet II, IPv4 only (the bridge carries nothing else of ours).
    if frame.len() < 14 || frame[12..14] != [0x08, 0x00] {
        return None;
    }
    let ip = &frame[14..];
    if ip.len() < 20 || ip[0] >> 4 != 4 || ip[9] != 6 {
        return None;
    }
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let tcp = ip.get(ihl..total)?;
    if tcp.len() < 20 {
        return None;
    }
    let sport = u16::from_be_bytes([tcp[0], tcp[1]]);
    let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let off = usize::from(tcp[12] >> 4) * 4;
    let payload = tcp.get(off..)?;
    Some((Flow { from: SocketAddrV4::new(src, sport), to: SocketAddrV4::new(dst, dport) }, seq, payload))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Ethernet/IPv4/TCP frame carrying `payload` at `seq`.
    fn frame(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend([0x08, 0x00]);
        let total = (20 + 20 + payload.len()) as u16;
        let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        f.extend(ip);
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&1234u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&80u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[12] = 5 << 4;
        f.extend(tcp);
        f.extend(payload);
        f
    }

    fn pcap(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut b = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        b.extend([0u8; 8]);
        b.extend(65535u32.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        for (n, f) in frames.iter().enumerate() {
            // Stamped 100.25 s, 101.25 s, ...
            b.extend((100 + n as u32).to_le_bytes());
            b.extend(250_000u32.to_le_bytes());
            b.extend((f.len() as u32).to_le_bytes());
            b.extend((f.len() as u32).to_le_bytes());
            b.extend(f);
        }
        b
    }

    #[test]
    fn a_text_split_across_segments_out_of_order_and_retransmitted_is_found() {
        // "secret-prompt" in three segments, sent out of order with a
        // retransmission, across the sequence number's wrap.
        let base = u32::MAX - 3;
        let frames = [
            frame(base.wrapping_add(6), b"-prom"),
            frame(base, b"secret"),
            frame(base, b"secret"),
            frame(base.wrapping_add(11), b"pt"),
        ];
        let flows = Flows::from_pcap(&pcap(&frames)).unwrap();
        assert_eq!((flows.packets, flows.last_at), (4, Some(103.25)));
        let f = flows.containing(b"secret-prompt");
        assert_eq!(f.len(), 1, "{flows:?}");
        assert_eq!(f[0].to, "10.0.0.2:80".parse().unwrap());
        assert_eq!(flows.bytes_to("10.0.0.2:80".parse().unwrap()), 13);
        assert!(flows.containing(b"nothing").is_empty());
    }

    #[test]
    fn a_capture_is_whole_when_what_tcpdump_did_not_write_came_after_the_traffic() {
        let c = |captured, received, dropped| Counts { captured: Some(captured), received: Some(received), dropped };
        // Everything written.
        assert!(written_in_full(c(10, 10, Some(0)), Some(50.0), 100.0).is_ok());
        // Five left in the kernel at the stop, all after the traffic ended.
        assert!(written_in_full(c(36931, 36936, Some(0)), Some(100.5), 100.0).is_ok());
        // Left in the kernel, but the file ends before the traffic did.
        assert!(written_in_full(c(36931, 36936, Some(0)), Some(99.0), 100.0).is_err());
        assert!(written_in_full(c(0, 3, Some(0)), None, 100.0).is_err());
        // Any drop by the kernel, or counts tcpdump did not print.
        assert!(written_in_full(c(10, 10, Some(1)), Some(100.5), 100.0).is_err());
        assert!(written_in_full(c(10, 10, None), Some(100.5), 100.0).is_err());
        let unknown = Counts { captured: None, received: Some(10), dropped: Some(0) };
        assert!(written_in_full(unknown, Some(100.5), 100.0).is_err());
    }

    #[test]
    fn what_is_not_a_pcap_file_is_refused() {
        assert!(Flows::from_pcap(b"short").is_err());
        assert!(Flows::from_pcap(&[0u8; 24]).is_err());
        let mut truncated = pcap(&[frame(1, b"abc")]);
        truncated.truncate(truncated.len() - 1);
        assert!(Flows::from_pcap(&truncated).is_err());
    }
}
