//! The replica launcher in-process, in front of a real server process: a
//! notice drains it (requests in flight finish, new ones are turned away
//! with the draining status the router understands), then the server is
//! stopped; a drain that outlasts its timeout says how much was in flight.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use onepool_decisions::annotation::ReclaimMode;
use onepool_launcher::access::Access;
use onepool_launcher::conventions::{ReplicaNote, REPLICA_KEY_HEADER};
use onepool_launcher::hop_tls::Fingerprint;
use onepool_launcher::launcher::{run, Front, FrontBounds, FrontConfig, LauncherConfig, Outcome};
use onepool_launcher::report::Report;

/// The dev cluster's stand-in model server (answers `GET /?sleep=S` after S seconds).
const SERVER: &str = include_str!("../../../etc/dev-cluster/stand-in-model-server.py");

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// onepoold's replica key in these tests.
const KEY: &str = "test-replica-key-0123456789abcdef";

/// (status, draining header) of a GET through the launcher, with the key.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, bool)> {
    get_with(addr, path, &format!("{REPLICA_KEY_HEADER}: {KEY}\r\n")).await
}

/// The same with `fields` as the extra header lines.
async fn get_with(addr: SocketAddr, path: &str, fields: &str) -> Option<(u16, bool)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{fields}Connection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.to_ascii_lowercase().contains("x-onepool-draining: 1")))
}

fn config(listen: SocketAddr, drain: Duration, command: Vec<String>) -> LauncherConfig {
    LauncherConfig {
        listen,
        backend: None,
        drain_timeout: drain,
        stop_grace: Duration::from_secs(5),
        reclaim: ReclaimMode::Graceful,
        command,
        access: Access::new(Some(KEY.as_bytes().to_vec()), Vec::new()),
        bounds: FrontBounds::default(),
        report: Report::Off,
        tls: false,
    }
}

/// The whole answer to a POST of `json` through the launcher (HTTP/1.1,
/// the connection closed after it), or what came before the connection
/// ended.
async fn post(addr: SocketAddr, json: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{REPLICA_KEY_HEADER}: {KEY}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        json.len()
    );
    s.write_all(format!("{head}{json}").as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    String::from_utf8_lossy(&buf).into_owned()
}

async fn launch(drain: Duration) -> (SocketAddr, Arc<Front>, tokio::task::JoinHandle<Outcome>) {
    launch_with(drain, &[]).await
}

/// A launcher in front of the stand-in server, with `env` for the server.
async fn launch_with(drain: Duration, env: &[&str]) -> (SocketAddr, Arc<Front>, tokio::task::JoinHandle<Outcome>) {
    launch_reclaimed(drain, env, ReclaimMode::Graceful).await
}

/// [`launch_with`] for a replica of a class reclaimed `reclaim`.
async fn launch_reclaimed(
    drain: Duration,
    env: &[&str],
    reclaim: ReclaimMode,
) -> (SocketAddr, Arc<Front>, tokio::task::JoinHandle<Outcome>) {
    let listen = free_addr();
    let mut command: Vec<String> = vec!["env".into()];
    command.extend(env.iter().map(|e| e.to_string()));
    command.extend(["python3".into(), "-c".into(), SERVER.into()]);
    let cfg = LauncherConfig { reclaim, ..config(listen, drain, command) };
    let front = Arc::new(Front::default());
    let f = front.clone();
    let task = tokio::spawn(async move { run(cfg, f).await.expect("launcher runs") });
    for _ in 0..100 {
        if get(listen, "/v1/x").await == Some((200, false)) {
            return (listen, front, task);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the server behind the launcher never answered");
}

fn notice() {
    // The launcher has its handler for it.
    onepool_os::raise(onepool_os::SIGUSR1).unwrap();
}

/// The notice is a signal to the whole test process: every launcher
/// running in it drains. Every test that runs a launcher takes its turn.
static NOTICE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_drains_in_flight_requests_turns_new_ones_away_and_stops_the_server() {
    let _turn = NOTICE.lock().await;
    // A clean drain: the slow request finishes, the late one is turned away.
    let (addr, front, task) = launch(Duration::from_secs(10)).await;
    let slow = tokio::spawn(async move { get(addr, "/v1/x?sleep=1.5").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(front.in_flight(), 1);
    notice();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(get(addr, "/v1/x").await, Some((503, true)), "new requests get the draining status");
    assert_eq!(slow.await.unwrap(), Some((200, false)), "the request in flight finished");
    match task.await.unwrap() {
        Outcome::Drained { waited } => {
            assert!(waited >= Duration::from_millis(900) && waited < Duration::from_secs(5), "{waited:?}")
        }
        other => panic!("expected a clean drain, got {other:?}"),
    }
    assert!(front.turned_away.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    assert!(get(addr, "/v1/x").await.is_none(), "the launcher is gone");

    // A drain that outlasts its timeout reports what was still in flight.
    let (addr, _front, task) = launch(Duration::from_millis(500)).await;
    let slow = tokio::spawn(async move { get(addr, "/v1/x?sleep=30").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    notice();
    assert_eq!(task.await.unwrap(), Outcome::TimedOut { in_flight: 1 });
    slow.abort();
}

/// An immediate class has GraceTime 0: Slurm's SIGTERM is the preemption
/// and the protected job waits for the GPUs, so what is in flight is cut
/// at once, not drained until KillWait's SIGKILL (issue #28's CI run: the
/// protected job waited the whole KillWait). A time-limit notice still
/// drains, and a SIGTERM during that drain cuts. The drain timeout is a
/// minute and the server ignores SIGTERM: only the cut ends these soon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_immediate_class_s_sigterm_cuts_what_is_in_flight_at_once() {
    let _turn = NOTICE.lock().await;
    let env = ["ONEPOOL_SECONDS_PER_TOKEN=0.1", "ONEPOOL_STANDIN_ON_SIGTERM=ignore"];
    let (addr, front, task) = launch_reclaimed(Duration::from_secs(60), &env, ReclaimMode::Immediate).await;
    let stream = tokio::spawn(async move { post(addr, r#"{"max_tokens": 900, "stream": true}"#).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(front.in_flight(), 1);
    onepool_os::raise(onepool_os::SIGTERM).unwrap();
    assert_eq!(task.await.unwrap(), Outcome::Cut { in_flight: 1 });
    let stream = stream.await.unwrap();
    let event = stream.lines().find(|l| l.starts_with("data: {\"error\"")).unwrap_or_else(|| panic!("{stream}"));
    assert!(event.contains("replica_reclaimed"), "{event}");
    assert_eq!(front.cut_short.load(std::sync::atomic::Ordering::SeqCst), 1);

    // A time-limit notice drains; the request stays in flight until Slurm's SIGTERM.
    let (addr, front, task) = launch_reclaimed(Duration::from_secs(60), &env, ReclaimMode::Immediate).await;
    let stream = tokio::spawn(async move { post(addr, r#"{"max_tokens": 900, "stream": true}"#).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    notice();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(get(addr, "/v1/x").await, Some((503, true)), "draining after the notice");
    assert_eq!(front.in_flight(), 1, "the notice cut nothing");
    assert!(!task.is_finished());
    onepool_os::raise(onepool_os::SIGTERM).unwrap();
    assert_eq!(task.await.unwrap(), Outcome::Cut { in_flight: 1 });
    assert!(stream.await.unwrap().contains("replica_reclaimed"));
}

/// A graceful class's SIGTERM (an admin's scancel, or Slurm's notice on a
/// site without PreemptParameters=send_user_signal) drains like the notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_class_s_sigterm_drains() {
    let _turn = NOTICE.lock().await;
    let (addr, _front, task) = launch(Duration::from_secs(10)).await;
    let slow = tokio::spawn(async move { get(addr, "/v1/x?sleep=1").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    onepool_os::raise(onepool_os::SIGTERM).unwrap();
    assert_eq!(slow.await.unwrap(), Some((200, false)), "the request in flight finished");
    assert!(matches!(task.await.unwrap(), Outcome::Drained { .. }));
}

/// A server that is gone (nothing listens on its port) gets the request
/// answered "draining": it never reached the server, so the router retries
/// it on another replica, whatever its method.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_dead_server_never_got_is_answered_draining() {
    let _turn = NOTICE.lock().await;
    let listen = free_addr();
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    let front = Arc::new(Front::default());
    // Nothing listens on the backend address.
    let cfg = FrontConfig {
        backend: free_addr(),
        access: Access::new(Some(KEY.as_bytes().to_vec()), Vec::new()),
        backend_auth: None,
        bounds: FrontBounds::default(),
        tls: None,
    };
    let task = tokio::spawn(onepool_launcher::launcher::serve_front(listener, Arc::new(cfg), front.clone()));
    assert_eq!(get(listen, "/v1/x").await, Some((503, true)));
    task.abort();
}

/// A server that takes the request and dies before answering (the
/// connection closed unanswered) gets it answered 502 with the mark the
/// router reads as "nothing was answered" (issue #50): the router sends
/// the request whole to another replica instead of passing the 502 on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_server_died_on_before_answering_is_marked_for_the_router_to_retry() {
    use tokio::io::AsyncReadExt;
    let _turn = NOTICE.lock().await;
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = server.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = server.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            drop(s);
        }
    });
    let listen = free_addr();
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap();
    let cfg = FrontConfig {
        backend,
        access: Access::new(Some(KEY.as_bytes().to_vec()), Vec::new()),
        backend_auth: None,
        bounds: FrontBounds::default(),
        tls: None,
    };
    let task =
        tokio::spawn(onepool_launcher::launcher::serve_front(listener, Arc::new(cfg), Arc::new(Front::default())));
    let answer = post(listen, r#"{"model":"m","messages":[]}"#).await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 502"), "{answer}");
    assert!(answer.contains("x-onepool-server-failed: 1"), "{answer}");
    assert!(!answer.contains("x-onepool-draining"), "{answer}");
    task.abort();
}

/// At the drain timeout, a stream still in flight ends with an OpenAI-style
/// error event that says why (and a well-formed end of the response, not a
/// cut connection), and a request still waiting for the server's answer
/// gets the draining status, so the router sends it to another replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_is_in_flight_at_the_drain_timeout_is_told_why_it_ends() {
    let _turn = NOTICE.lock().await;
    // 40 tokens at 0.1 s: 4 s, past the 0.8 s drain timeout.
    let (addr, front, task) = launch_with(Duration::from_millis(800), &["ONEPOOL_SECONDS_PER_TOKEN=0.1"]).await;
    let stream = tokio::spawn(async move { post(addr, r#"{"max_tokens": 40, "stream": true}"#).await });
    let plain = tokio::spawn(async move { post(addr, r#"{"max_tokens": 40}"#).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(front.in_flight(), 2);
    let t0 = std::time::Instant::now();
    notice();
    assert_eq!(task.await.unwrap(), Outcome::TimedOut { in_flight: 2 });
    let (stream, plain) = (stream.await.unwrap(), plain.await.unwrap());
    assert!(t0.elapsed() < Duration::from_secs(3), "cut at the timeout, not at the stream's end: {:?}", t0.elapsed());

    assert!(stream.starts_with("HTTP/1.1 200"), "{stream}");
    assert!(stream.contains(r#""content": "x""#), "some tokens came first: {stream}");
    assert!(!stream.contains("[DONE]"), "{stream}");
    let event = stream.lines().find(|l| l.starts_with("data: {\"error\"")).unwrap_or_else(|| panic!("{stream}"));
    let e: serde_json::Value = serde_json::from_str(&event["data: ".len()..]).unwrap();
    assert_eq!(e["error"]["code"], "replica_reclaimed");
    assert_eq!(e["error"]["type"], "server_error");
    assert!(stream.ends_with("0\r\n\r\n"), "the chunked body ends properly: {stream:?}");

    assert!(plain.starts_with("HTTP/1.1 503"), "{plain}");
    assert!(plain.to_ascii_lowercase().contains("x-onepool-draining: 1"), "{plain}");
    assert_eq!(front.cut_short.load(std::sync::atomic::Ordering::SeqCst), 2);
}

/// Stopping the server stops what it started too (vLLM forks workers that
/// hold GPUs): the whole process group goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_server_stops_the_processes_it_started() {
    let _turn = NOTICE.lock().await;
    let pidfile = std::env::temp_dir().join(format!("onepool-launcher-worker-{}", std::process::id()));
    let script = format!("sleep 300 & echo $! > {}; exec python3 -c \"$0\"", pidfile.display());
    let listen = free_addr();
    let cfg = config(listen, Duration::from_secs(5), vec!["sh".into(), "-c".into(), script, SERVER.into()]);
    let front = Arc::new(Front::default());
    let task = tokio::spawn(async move { run(cfg, front).await.expect("launcher runs") });
    for _ in 0..100 {
        if get(listen, "/v1/x").await == Some((200, false)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let worker: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    // Running, not a zombie waiting for init to reap it.
    let alive = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
    };
    assert!(alive(worker), "the server's worker runs");
    notice();
    assert!(matches!(task.await.unwrap(), Outcome::Drained { .. }));
    // Reaped by init once killed; give it a moment.
    for _ in 0..50 {
        if !alive(worker) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive(worker), "the worker went with the server");
    std::fs::remove_file(&pidfile).unwrap();
}

/// Issue #25: the launcher answers only requests with onepoold's key, only
/// on the endpoint's paths; the model server's own port answers nobody
/// without the key the launcher made for it; a client that sends its head
/// slowly is cut at the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_onepoold_s_router_is_answered_and_only_on_the_endpoint_s_paths() {
    let _turn = NOTICE.lock().await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listen = free_addr();
    let backend = free_addr();
    let mut cfg = config(listen, Duration::from_secs(5), vec!["python3".into(), "-c".into(), SERVER.into()]);
    cfg.backend = Some(backend);
    cfg.bounds.header_read_timeout = Duration::from_millis(500);
    let front = Arc::new(Front::default());
    let f = front.clone();
    let task = tokio::spawn(async move { run(cfg, f).await.expect("launcher runs") });
    for _ in 0..100 {
        if get(listen, "/v1/x").await == Some((200, false)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(get(listen, "/v1/x").await, Some((200, false)));
    assert_eq!(get_with(listen, "/v1/x", "").await, Some((401, false)), "no key");
    let wrong = format!("{REPLICA_KEY_HEADER}: {}\r\n", KEY.replace('0', "1"));
    assert_eq!(get_with(listen, "/v1/x", &wrong).await, Some((401, false)), "a wrong key");
    let bearer = format!("Authorization: Bearer {KEY}\r\n");
    assert_eq!(get_with(listen, "/v1/x", &bearer).await, Some((401, false)), "the key in another header");
    for admin in ["/slots", "/props", "/v1/../slots", "/v1/%2e%2e/props", "//slots"] {
        assert_eq!(get(listen, admin).await, Some((404, false)), "{admin} with the key");
    }
    // The server's port, straight: the launcher's key is not its key, and
    // without its own the server refuses (as llama-server with --api-key).
    assert_eq!(get_with(backend, "/v1/x", "").await, Some((401, false)));
    assert_eq!(get(backend, "/v1/x").await, Some((401, false)));
    // Slowloris: half a head, then silence; cut at the header timeout.
    let mut slow = tokio::net::TcpStream::connect(listen).await.unwrap();
    slow.write_all(b"GET /v1/x HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let t0 = std::time::Instant::now();
    let mut buf = Vec::new();
    let r = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut buf)).await;
    assert!(r.is_ok(), "the connection was not closed within 5 s");
    assert!(t0.elapsed() >= Duration::from_millis(400), "closed before the timeout: {:?}", t0.elapsed());
    assert!(front.refused.load(std::sync::atomic::Ordering::Relaxed) >= 8);
    task.abort();
}

/// Issue #24: a server that dies is named by its signal, with its last
/// output lines, and the launcher ends with 128 + the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_is_named_with_its_last_output() {
    let _turn = NOTICE.lock().await;
    let script = "echo loading model; echo 'ggml_backend_amx_mul_mat: tile config' >&2; kill -SEGV $$";
    let cfg = config(free_addr(), Duration::from_secs(5), vec!["sh".into(), "-c".into(), script.into()]);
    let out =
        tokio::time::timeout(Duration::from_secs(10), run(cfg, Arc::new(Front::default()))).await.unwrap().unwrap();
    let Outcome::ServerExited(ended) = &out else { panic!("{out:?}") };
    assert_eq!(ended.cause, "killed by SIGSEGV");
    assert_eq!(out.exit_code(), 139);
    assert!(ended.tail.contains(&"loading model".to_string()), "{:?}", ended.tail);
    assert!(ended.report().contains("ggml_backend_amx_mul_mat: tile config"), "{}", ended.report());

    let cfg =
        config(free_addr(), Duration::from_secs(5), vec!["sh".into(), "-c".into(), "echo no model; exit 3".into()]);
    let out = run(cfg, Arc::new(Front::default())).await.unwrap();
    assert_eq!(out.exit_code(), 3);
    let Outcome::ServerExited(ended) = out else { panic!() };
    assert_eq!(ended.report(), "exited with code 3; last output:\nno model");
}

/// The whole answer to a GET with `fields` over TLS to `addr`, accepting
/// only the certificate `pin`; Err: the handshake failed.
async fn get_tls(addr: SocketAddr, pin: Fingerprint, fields: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let client = onepool_launcher::hop_tls::pinned_client(pin)?;
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let mut s = tokio_rustls::TlsConnector::from(client.config)
        .connect(client.name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    s.write_all(format!("GET /v1/x HTTP/1.1\r\nHost: x\r\n{fields}Connection: close\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// With --tls the launcher's note carries its certificate's fingerprint
/// beside its port (written by scontrol, here a script that keeps what it
/// was asked to write), and its front speaks TLS only: the pinned client
/// is answered with the key and refused without it, a client pinned to
/// another certificate never completes the handshake (so never sends the
/// key), and clear HTTP gets no answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_the_note_pins_the_certificate_and_only_the_pinned_router_with_the_key_is_answered() {
    let _turn = NOTICE.lock().await;
    let dir = std::env::temp_dir().join(format!("onepool-launcher-tls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let scontrol = dir.join("scontrol");
    let comment = dir.join("comment");
    std::fs::write(&scontrol, format!("#!/bin/sh\necho \"$3\" > {}.new && mv {0}.new {0}\n", comment.display()))
        .unwrap();
    std::fs::set_permissions(&scontrol, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let listen = free_addr();
    let command = vec!["python3".into(), "-c".into(), SERVER.into()];
    let report = Report::Comment { scontrol: scontrol.display().to_string(), job: 7, slot: 3 };
    let cfg = LauncherConfig { tls: true, report, ..config(listen, Duration::from_secs(5), command) };
    let front = Arc::new(Front::default());
    let task = tokio::spawn(run(cfg, front.clone()));
    let mut note = None;
    for _ in 0..100 {
        note = std::fs::read_to_string(&comment)
            .ok()
            .and_then(|c| ReplicaNote::decode(c.trim().strip_prefix("Comment=")?))
            .filter(|n| n.port(3).is_some());
        if note.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let note = note.expect("the launcher wrote its note");
    assert_eq!(note.port(3), Some(listen.port()));
    let pin = note.pin(3).expect("the note carries the certificate's fingerprint");
    let key = format!("{REPLICA_KEY_HEADER}: {KEY}\r\n");
    let mut answer = String::new();
    for _ in 0..100 {
        answer = get_tls(listen, pin, &key).await.unwrap();
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let keyless = get_tls(listen, pin, "").await.unwrap();
    assert!(keyless.starts_with("HTTP/1.1 401"), "{keyless}");
    let refused_before = front.refused.load(std::sync::atomic::Ordering::SeqCst);
    let other = Fingerprint([0x5a; 32]);
    let e = get_tls(listen, other, &key).await.unwrap_err();
    assert!(e.contains("handshake") && e.to_lowercase().contains("certificate"), "{e}");
    assert_eq!(get(listen, "/v1/x").await, None, "clear HTTP gets no HTTP answer");
    assert!(front.refused.load(std::sync::atomic::Ordering::SeqCst) > refused_before);
    onepool_os::raise(onepool_os::SIGUSR1).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), task).await.unwrap().unwrap().unwrap();
    assert!(matches!(outcome, Outcome::Drained { .. }), "{outcome:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
