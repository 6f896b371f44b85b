# A stand-in for a model server on GPU-less dev clusters and in tests
# (python3, standard library only). It listens on 127.0.0.1:$ONEPOOL_BACKEND_PORT
# (set by `onepool replica`) and:
#   - waits $ONEPOOL_MODEL_LOAD_SECONDS (default 0) before answering, like a
#     model load; /health answers 503 until then, 200 after;
#   - answers GET /v1/anything?sleep=S after S seconds;
#   - like llama-server with --api-key, answers 401 to a request without
#     `Authorization: Bearer $ONEPOOL_BACKEND_API_KEY` (set by `onepool
#     replica`) on every path but /health;
#   - answers POST (OpenAI-style JSON with "max_tokens") after
#     max_tokens * $ONEPOOL_SECONDS_PER_TOKEN (default 0.001) seconds, so
#     latency follows the requests' generated tokens; with "stream": true,
#     as server-sent events in OpenAI's shape (an id, a role chunk for a
#     chat, one chunk of "x" per token at that pace, the finish_reason,
#     usage when stream_options.include_usage asks, then "data: [DONE]");
#     a chat whose last message is the assistant's is continued (its
#     tokens count as prompt), as onepoold's router continues an answer on
#     another replica by text (issue #43);
#   - on SIGTERM, per $ONEPOOL_STANDIN_ON_SIGTERM: "exit" (default: at once,
#     requests in flight are lost), "finish" (stop accepting, finish what is
#     in flight, then exit) or "ignore" (keep serving until killed). The
#     reclaim benchmark compares Slurm's native grace time with these.
import http.server, itertools, json, os, signal, sys, threading, time, urllib.parse

loaded = threading.Event()
threading.Timer(float(os.environ.get("ONEPOOL_MODEL_LOAD_SECONDS", "0")), loaded.set).start()
per_token = float(os.environ.get("ONEPOOL_SECONDS_PER_TOKEN", "0.001"))
api_key = os.environ.get("ONEPOOL_BACKEND_API_KEY")
ids = itertools.count()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def authorized(self):
        if api_key is None or self.headers.get("Authorization") == f"Bearer {api_key}":
            return True
        self.answer(401, b"invalid api key\n")
        return False

    def do_GET(self):
        url = urllib.parse.urlparse(self.path)
        if url.path == "/health":
            return self.answer(200 if loaded.is_set() else 503, b"ok\n" if loaded.is_set() else b"loading\n")
        if not self.authorized():
            return
        loaded.wait()
        time.sleep(float(urllib.parse.parse_qs(url.query).get("sleep", ["0"])[0]))
        self.answer(200, b"ok\n")

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        if not self.authorized():
            return
        loaded.wait()
        try:
            req = json.loads(body or b"{}")
            tokens = int(req.get("max_tokens", 16))
        except (ValueError, AttributeError):
            return self.answer(400, b"bad JSON\n")
        chat = self.path.split("?")[0].endswith("/chat/completions")
        messages = req.get("messages") if chat and isinstance(req.get("messages"), list) else []
        # One prompt token per word; a last assistant message is continued.
        prompt = sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
        prompt += len(str(req.get("prompt", "")).split())
        answer_id = f"{'chatcmpl' if chat else 'cmpl'}-standin-{os.getpid()}-{next(ids)}"
        if req.get("stream"):
            usage = isinstance(req.get("stream_options"), dict) and req["stream_options"].get("include_usage")
            return self.stream(tokens, chat, answer_id, prompt, usage)
        time.sleep(tokens * per_token)
        choice = {"index": 0, "finish_reason": "length"}
        if chat:
            choice["message"] = {"role": "assistant", "content": "x" * min(tokens, 64)}
        else:
            choice["text"] = "x" * min(tokens, 64)
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}
        self.answer(200, json.dumps({"id": answer_id, "choices": [choice], "usage": usage}).encode())

    def stream(self, tokens, chat, answer_id, prompt, usage):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        head = {"id": answer_id, "object": "chat.completion.chunk" if chat else "text_completion", "created": int(time.time()), "model": "stand-in"}

        def chunk(data):
            event = f"data: {data}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.flush()

        def choice(text, finish=None):
            c = {"index": 0, "delta": {"content": text} if text is not None else {}} if chat else {"index": 0, "text": text or ""}
            c["finish_reason"] = finish
            return json.dumps(dict(head, choices=[c]))

        if chat:
            chunk(json.dumps(dict(head, choices=[{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}])))
        for _ in range(tokens):
            time.sleep(per_token)
            chunk(choice("x"))
        chunk(choice(None, "length"))
        if usage:
            chunk(json.dumps(dict(head, choices=[], usage={"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens})))
        chunk("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args):
        pass


in_flight = 0
lock = threading.Lock()


class Server(http.server.ThreadingHTTPServer):
    def process_request_thread(self, request, client_address):
        global in_flight
        with lock:
            in_flight += 1
        try:
            super().process_request_thread(request, client_address)
        finally:
            with lock:
                in_flight -= 1


server = Server(("127.0.0.1", int(os.environ["ONEPOOL_BACKEND_PORT"])), Handler)
mode = os.environ.get("ONEPOOL_STANDIN_ON_SIGTERM", "exit")


def on_sigterm(signum, frame):
    if mode == "ignore":
        print("stand-in server: SIGTERM ignored", flush=True)
        return
    if mode == "finish":
        # Stop accepting at once; exit when the last request is answered.
        server.socket.close()
        print(f"stand-in server: SIGTERM, finishing {in_flight} request(s)", flush=True)
        while in_flight > 0:
            time.sleep(0.05)
    print("stand-in server: SIGTERM, exiting", flush=True)
    os._exit(0)


signal.signal(signal.SIGTERM, on_sigterm)
server.serve_forever()
