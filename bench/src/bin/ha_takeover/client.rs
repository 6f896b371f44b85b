//! The steady client load, run on the client host (`ha_takeover
//! client-load`, in its network namespace): clients that know both
//! instances' addresses, as with DNS naming both (docs/ha.md, "One address
//! for clients"), and retry a request whose connection fails before an
//! answer on the other address, as the OpenAI client does (up to 2
//! retries). Every attempt is recorded, so the first one of each request
//! is what a client without retries would have seen.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

/// The OpenAI client's default `max_retries`.
const RETRIES: usize = 2;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Longer than any request of the load: an attempt still unanswered then
/// is one whose instance went silent (a cut link), not a slow one.
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How one attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Ok,
    /// An HTTP answer other than 200: not retried (the router answered).
    Status(u16),
    /// The connection could not be made (refused, unreachable, timed out).
    Connect,
    /// Sent, then the connection ended before the status line: the
    /// request was in flight on an instance that died.
    Dropped,
    /// Sent, then nothing for [`READ_TIMEOUT`].
    Silent,
}

impl Ending {
    fn retried(self) -> bool {
        matches!(self, Ending::Connect | Ending::Dropped | Ending::Silent)
    }

    fn name(self) -> String {
        match self {
            Ending::Ok => "ok".into(),
            Ending::Status(s) => format!("status {s}"),
            Ending::Connect => "connect".into(),
            Ending::Dropped => "dropped".into(),
            Ending::Silent => "silent".into(),
        }
    }

    fn parse(s: &str) -> Option<Ending> {
        Some(match s {
            "ok" => Ending::Ok,
            "connect" => Ending::Connect,
            "dropped" => Ending::Dropped,
            "silent" => Ending::Silent,
            _ => Ending::Status(s.strip_prefix("status ")?.parse().ok()?),
        })
    }
}

/// One attempt of a request: where it went, when (Unix seconds), how it ended.
#[derive(Clone, Debug)]
pub struct Attempt {
    pub to: SocketAddr,
    pub start: f64,
    pub end: f64,
    pub ending: Ending,
}

/// One request as its client saw it: its attempts, the first one first.
#[derive(Clone, Debug)]
pub struct Request {
    pub client: usize,
    pub attempts: Vec<Attempt>,
}

impl Request {
    pub fn ok(&self) -> bool {
        self.attempts.last().is_some_and(|a| a.ending == Ending::Ok)
    }

    pub fn first(&self) -> &Attempt {
        &self.attempts[0]
    }

    fn to_json(&self) -> Value {
        let attempts: Vec<Value> = self
            .attempts
            .iter()
            .map(|a| json!({"to": a.to.to_string(), "start": a.start, "end": a.end, "ending": a.ending.name()}))
            .collect();
        json!({"client": self.client, "attempts": attempts})
    }

    pub fn from_json(line: &str) -> Option<Request> {
        let v: Value = serde_json::from_str(line).ok()?;
        let attempts = v["attempts"]
            .as_array()?
            .iter()
            .map(|a| {
                Some(Attempt {
                    to: a["to"].as_str()?.parse().ok()?,
                    start: a["start"].as_f64()?,
                    end: a["end"].as_f64()?,
                    ending: Ending::parse(a["ending"].as_str()?)?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let client = usize::try_from(v["client"].as_u64()?).ok()?;
        (!attempts.is_empty()).then_some(Request { client, attempts })
    }
}

pub fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One chat completion of `max_tokens` to `to`, on a connection of its own.
fn attempt(to: SocketAddr, max_tokens: u32) -> Attempt {
    let start = now();
    let done = |ending| Attempt { to, start, end: now(), ending };
    let Ok(mut s) = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT) else {
        return done(Ending::Connect);
    };
    let _ = s.set_read_timeout(Some(READ_TIMEOUT));
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":{max_tokens},"stream":false}}"#
    );
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {to}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).and_then(|_| s.write_all(body.as_bytes())).is_err() {
        return done(Ending::Dropped);
    }
    let mut r = BufReader::new(s);
    let mut line = String::new();
    match r.read_line(&mut line) {
        Ok(0) => return done(Ending::Dropped),
        Ok(_) => {}
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            return done(Ending::Silent)
        }
        Err(_) => return done(Ending::Dropped),
    }
    let status: u16 = line.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    // The body must arrive whole: an answer cut short is no answer.
    let mut rest = Vec::new();
    match r.read_to_end(&mut rest) {
        Ok(_) if status == 200 => done(Ending::Ok),
        Ok(_) => done(Ending::Status(status)),
        Err(_) => done(Ending::Dropped),
    }
}

/// One request with its retries. `prefer` is the client's address of
/// choice; after a failed connection it moves to the next one and stays
/// there (a dead instance costs each client one failure, then it is not
/// tried again until the other fails).
fn request(client: usize, addresses: &[SocketAddr], prefer: &mut usize, max_tokens: u32) -> Request {
    let mut attempts = Vec::new();
    for _ in 0..=RETRIES {
        let a = attempt(addresses[*prefer % addresses.len()], max_tokens);
        let retry = a.ending.retried();
        attempts.push(a);
        if !retry {
            break;
        }
        *prefer += 1;
    }
    Request { client, attempts }
}

/// `client-load CLIENTS MAX_TOKENS ADDRESS...`: sends requests back to back
/// from each client until stdin closes, then prints every request as one
/// JSON line. Client `i` starts on address `i % n`, so both instances carry
/// the load.
pub fn run(args: &[String]) {
    let usage = "usage: ha_takeover client-load CLIENTS MAX_TOKENS ADDRESS...";
    let clients: usize = args.first().and_then(|a| a.parse().ok()).expect(usage);
    let max_tokens: u32 = args.get(1).and_then(|a| a.parse().ok()).expect(usage);
    let addresses: Vec<SocketAddr> = args[2..].iter().map(|a| a.parse().expect(usage)).collect();
    assert!(!addresses.is_empty(), "{usage}");
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..clients)
        .map(|i| {
            let (stop, done, addresses) = (stop.clone(), done.clone(), addresses.clone());
            std::thread::spawn(move || {
                let mut prefer = i;
                while !stop.load(Ordering::SeqCst) {
                    let r = request(i, &addresses, &mut prefer, max_tokens);
                    let failed = !r.ok();
                    done.lock().unwrap().push(r);
                    if failed {
                        // As a client's back-off: no busy loop on a dead pair.
                        std::thread::sleep(Duration::from_millis(500));
                    }
                }
            })
        })
        .collect();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let out = std::io::stdout();
    let mut out = out.lock();
    for r in done.lock().unwrap().iter() {
        let _ = writeln!(out, "{}", r.to_json());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_its_json_line() {
        let r = Request {
            client: 3,
            attempts: vec![
                Attempt { to: "10.0.0.1:80".parse().unwrap(), start: 1.5, end: 2.0, ending: Ending::Dropped },
                Attempt { to: "10.0.0.2:80".parse().unwrap(), start: 2.0, end: 2.5, ending: Ending::Status(503) },
            ],
        };
        let back = Request::from_json(&r.to_json().to_string()).unwrap();
        assert_eq!(back.client, 3);
        assert_eq!(back.attempts.len(), 2);
        assert_eq!(back.attempts[1].ending, Ending::Status(503));
        assert!(!back.ok());
    }

    #[test]
    fn a_refused_connection_moves_the_client_to_the_next_address() {
        // A port nothing listens on: bound, then closed.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let live = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let live_at = live.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = live.accept().unwrap();
            // The whole request first (head, then the body its length
            // says): closing with bytes unread would reset the connection
            // and the client would see it dropped (it did, once in five).
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = s.read(&mut buf).unwrap_or(0);
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(head) = text.find("\r\n\r\n") {
                    let len = text[..head]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string())
                        })
                        .and_then(|v| v.parse::<usize>().ok())
                        .unwrap_or(0);
                    if got.len() >= head + 4 + len {
                        break;
                    }
                }
                if n == 0 {
                    break;
                }
            }
            s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}").unwrap();
        });
        let mut prefer = 0;
        let r = request(0, &[dead, live_at], &mut prefer, 1);
        server.join().unwrap();
        let endings: Vec<Ending> = r.attempts.iter().map(|a| a.ending).collect();
        assert_eq!(endings, [Ending::Connect, Ending::Ok]);
        assert!(r.ok() && r.first().ending == Ending::Connect);
        assert_eq!(prefer, 1, "the client stays on the address that answered");
    }
}
