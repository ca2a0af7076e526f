"""Server fault drills: what an attacker and a careless client send to ``taskdata serve``.

Each drill starts a real ``taskdata serve`` (uvicorn, 127.0.0.1, a free port, a bearer token) over
small caches built with ``taskdata cache`` (tasks of ``tests.cache_tasks``, train and validation),
sends its requests, stops the server by its pid and returns its figures; ``ok`` says whether every
expectation held:

- ``server-auth-matrix``: every route of the OpenAPI schema (and /openapi.json), GET and POST, with no
  token, a wrong one and the right one: 401 without the right token everywhere but /healthz, whatever
  the method or body (a malformed body included); the documented answers with it;
- ``server-name-corpus``: names that try to walk the file system or slip past validation (``..``,
  ``%2e%2e``, ``/``, ``\\``, NUL, newline, Unicode lookalikes, very long, leading ``_``) in every name
  parameter (run and task path parameters, the ``run`` query parameter, POST /runs' name, mixture and
  split), percent-encoded and raw: never accepted, never a server error, no file created or changed,
  nothing outside the cache root in an answer;
- ``server-headers``: oversize headers (431), clients that send their headers a byte at a time or not
  at all (cut off at the header deadline), idle keep-alive connections (closed), and the latency of
  whole requests while slow clients hold connections, next to the latency without them;
- ``server-bodies``: unauthenticated 50 MB bodies (refused unread: the server's memory before and
  after), and bodies over the cap with the token (413);
- ``server-schemathesis``: schemathesis requests generated from /openapi.json (fetched with the token),
  positive and negative data, every check but "a valid request is accepted": the count of server
  errors must be 0.

Sizes default to the full run (``python deploy/faults.py``); the tests call the same functions smaller.
Every wait has a deadline; every process started here is stopped by its pid.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

__all__ = [
    "DRILLS",
    "NAME_CORPUS",
    "auth_matrix",
    "bodies",
    "headers",
    "name_corpus",
    "schemathesis_run",
]

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
IO_TIMEOUT = 30.0  # any one socket operation
RUN, VALIDATION_RUN, TASK = "drill", "drill_val", "toy_det"
VALID_CREATE = {"name": RUN, "mixture": TASK, "seed": 0, "schedule": {"start": 8}, "num_data_shards": 2}
VALID_STAGE = {"start": 1000, "batch": {"start": 16}, "current_step": 1000}  # a retry of it answers 200

# Invalid task, run or split names, each as the server's parameter would hold it after decoding.
NAME_CORPUS = [
    ".",
    "..",
    "../x",
    "../../../../etc/passwd",
    "../_runs/drill",
    "..\\..\\windows\\win.ini",
    "a/b",
    "/etc/passwd",
    "\\",
    "a\\b",
    "%2e%2e",
    "%2e%2e%2f_runs%2fdrill",
    "..%2f..%2fetc%2fpasswd",
    "%00",
    "drill\x00",
    "\x00",
    "drill\n",
    "rnl\n",
    "drill\r\nX-Injected: 1",
    "drill\t",
    " drill",
    "drill ",
    "\uff44\uff52\uff49\uff4c\uff4c",  # fullwidth 'drill'
    "\uff0e\uff0e",  # fullwidth full stops
    "\u2025",  # two dot leader, looks like '..'
    "\u2024\u2024",  # one dot leaders
    "dr\u0456ll",  # Cyrillic i
    "drill\u200b",  # zero-width space
    "\ufeffdrill",  # byte order mark
    "dri\u0301ll",  # combining accent
    "a" * 201,
    "a" * 8000,
    "_runs",
    "_drill",
    "",
]


# --- a served cache root --------------------------------------------------------------------------


def _caches() -> Path:
    """A cache root with toy_det and toy_random (train and validation) and two stored runs, built once
    per process with the CLI (removed at exit). Do not modify it: drills that write copy it.

    The servers list the built-in tasks too (GET /tasks), whose first fingerprint trains their
    vocabulary into $TASKDATA_HOME: 'taskdata show' does that here, once, before any server starts.
    """
    global _built
    if _built is None:
        work = Path(tempfile.mkdtemp(prefix="taskdata-server-drills-"))
        atexit.register(shutil.rmtree, work, True)
        root = work / "caches"
        for task in ("toy_det", "toy_random"):
            _taskdata("cache", "--task", task, "--output", str(root), "--num-shards", "3", "--quiet")
        common = ["--cache-root", str(root), "--mixture", TASK, "--seed", "0", "--batch-size", "8"]
        _taskdata("plan", *common, "--name", RUN, "--num-data-shards", "2")
        _taskdata(
            "plan", *common, "--name", VALIDATION_RUN, "--num-data-shards", "2", "--split", "validation"
        )
        _taskdata("show", "c4_span_corruption")
        _built = root
    return _built


_built: Path | None = None


def _environment() -> dict[str, str]:
    """This process's environment (its $TASKDATA_HOME, C4 folder and vocabulary) but no server settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKDATA_SERVER_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _taskdata(*args: str) -> str:
    command = [sys.executable, "-m", "taskdata", args[0], "--module", "tests.cache_tasks", *args[1:]]
    result = subprocess.run(
        command, cwd=REPO, env=_environment(), capture_output=True, text=True, timeout=600
    )
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


@dataclasses.dataclass
class Site:
    """A running ``taskdata serve``."""

    work: Path
    root: Path
    token: str
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no VmRSS for pid {self.process.pid}")

    def files(self) -> dict[str, tuple[int, int]]:
        """Every file under the work folder but the server's log: (size, mtime_ns) by path."""
        out = {}
        for path in self.work.rglob("*"):
            if path.is_file() and path != self.log:
                stat = path.stat()
                out[str(path.relative_to(self.work))] = (stat.st_size, stat.st_mtime_ns)
        return out


@contextlib.contextmanager
def serving(*flags: str) -> Iterator[Site]:
    """``taskdata serve`` over a copy of the drill caches, stopped (by its pid) on exit."""
    work = Path(tempfile.mkdtemp(prefix="taskdata-server-drill-"))
    process = None
    try:
        root = work / "caches"
        shutil.copytree(_caches(), root)
        token = secrets.token_urlsafe(24)
        token_file = work / "token"
        token_file.write_text(token)
        port = _free_port()
        log = work / "server.log"
        command = [
            sys.executable, "-m", "taskdata", "serve", "--module", "tests.cache_tasks", "--cache-root", str(root),
            "--token-file", str(token_file), "--host", "127.0.0.1", "--port", str(port), "--no-access-log", *flags,
        ]  # fmt: skip
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command, cwd=REPO, env=_environment(), stdout=out, stderr=subprocess.STDOUT
            )
        site = Site(work, root, token, port, process, log)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"taskdata serve exited with {process.returncode}:\n{log.read_text()[-3000:]}"
                )
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{site.url}/healthz", timeout=1.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"taskdata serve did not answer within {START_TIMEOUT} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.1)
        yield site
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(work, ignore_errors=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- raw HTTP -----------------------------------------------------------------------------------------


def _connect(site: Site, timeout: float = IO_TIMEOUT) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", site.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _request_bytes(method: str, target: bytes, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    lines += [f"{k}: {v}".encode() for k, v in headers.items()]
    if body:
        lines.append(b"Content-Length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _status(answer: bytes) -> int | None:
    """The status of a raw answer; None if the server closed without one."""
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else None


def _raw(
    site: Site, method: str, target: bytes, headers: dict[str, str], body: bytes = b""
) -> tuple[int | None, bytes]:
    with _connect(site) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(_request_bytes(method, target, headers, body))
        answer = _read_all(sock)
    return _status(answer), answer


# --- the auth matrix ------------------------------------------------------------------------------


def auth_matrix() -> dict[str, Any]:
    """Every route x GET/POST x (no token, a wrong token, the right one)."""
    with serving() as site:
        schema = httpx.get(f"{site.url}/openapi.json", headers=site.auth, timeout=IO_TIMEOUT).json()
        documented = {path: {m.upper() for m in ops} for path, ops in schema["paths"].items()}
        documented["/openapi.json"] = {"GET"}
        targets = {
            "/runs/{name}": f"/runs/{RUN}",
            "/tasks/{name}": f"/tasks/{TASK}",
            "/shards": f"/shards?run={RUN}&host=0&step=0",
            "/runs/{name}/ledger": f"/runs/{RUN}/ledger?step=0",
            "/runs/{name}/summary": f"/runs/{RUN}/summary?step=0",
            "/runs/{name}/stages": f"/runs/{RUN}/stages",
        }
        bodies = {"/runs/{name}/stages": VALID_STAGE}
        credentials = {
            "none": {},
            "wrong": {"Authorization": "Bearer " + secrets.token_urlsafe(24)},
            "right": site.auth,
        }
        rows = []
        for path, methods in sorted(documented.items()):
            target = targets.get(path, path).encode()
            for method in ("GET", "POST"):
                body = json.dumps(bodies.get(path, VALID_CREATE)).encode() if method == "POST" else b""
                for who, auth in credentials.items():
                    headers = {**auth, "Content-Type": "application/json"} if body else dict(auth)
                    status, _ = _raw(site, method, target, headers, body)
                    if path == "/healthz":
                        expected = {200} if method == "GET" else {405}
                    elif who != "right":
                        expected = {401}
                    elif method in methods:
                        expected = {200, 201}
                    else:
                        expected = {405}
                    rows.append((method, path, who, status, expected))
        # A malformed body is refused for its missing token before it is parsed (before: 422).
        for who, auth in credentials.items():
            status, _ = _raw(
                site, "POST", b"/runs", {**auth, "Content-Type": "application/json"}, b"{not json"
            )
            rows.append(("POST", "/runs (malformed body)", who, status, {422} if who == "right" else {401}))
    unexpected = [f"{m} {p} [{who}]: {s}, expected {sorted(e)}" for m, p, who, s, e in rows if s not in e]
    return {
        "ok": not unexpected,
        "routes": len(documented),
        "requests": len(rows),
        "refused_401": sum(s == 401 for *_, s, _ in rows),
        "unexpected": len(unexpected),
        "unexpected_examples": unexpected[:5],
    }


# --- the name corpus ------------------------------------------------------------------------------


def name_corpus(names: list[str] | None = None) -> dict[str, Any]:
    """Every name of the corpus in every name parameter, percent-encoded and raw."""
    from taskdata.names import InvalidNameError, validate_name

    names = NAME_CORPUS if names is None else names
    for name in names:  # the corpus itself must hold only invalid names
        with contextlib.suppress(InvalidNameError):
            validate_name(name)
            raise ValueError(f"{name!r} is a valid name: it does not belong in the corpus")
    statuses: Counter[str] = Counter()
    accepted, leaked = [], []
    with serving() as site:
        before = site.files()
        control = _raw(site, "GET", f"/runs/{RUN}".encode(), site.auth)[0]  # the routes do answer
        for name in names:
            encoded = urllib.parse.quote(name, safe="").encode()
            raw = name.encode("utf-8", "surrogateescape")
            requests = []
            # Whitespace or a control character sent raw changes the request itself (another target, a
            # header), not the name: those names go percent-encoded only.
            forms = [("encoded", encoded)] + (
                [] if any(c <= " " or c == "\x7f" for c in name) else [("raw", raw)]
            )
            for form, text in forms:
                requests += [
                    (f"GET /runs/{{name}} {form}", "GET", b"/runs/" + text, b""),
                    (f"GET /tasks/{{name}} {form}", "GET", b"/tasks/" + text, b""),
                    (f"GET /shards?run= {form}", "GET", b"/shards?host=0&step=0&run=" + text, b""),
                ]
            for field in ("name", "mixture", "split"):
                body = json.dumps({**VALID_CREATE, "name": "corpus_probe", field: name}).encode()
                requests.append((f"POST /runs {field}", "POST", b"/runs", body))
            for label, method, target, body in requests:
                headers = {**site.auth, "Content-Type": "application/json"} if body else dict(site.auth)
                status, answer = _raw(site, method, target, headers, body)
                statuses[str(status) if status is not None else "closed"] += 1
                if status is not None and status < 300:
                    accepted.append(f"{label} {name!r}: {status}")
                if b"root:x:0:0" in answer or str(site.work).encode() in answer:
                    leaked.append(f"{label} {name!r}: {answer[-300:]!r}")
        changed = sorted(set(site.files().items()) ^ set(before.items()))
    server_errors = sum(n for status, n in statuses.items() if status.isdigit() and int(status) >= 500)
    return {
        "ok": control == 200 and not accepted and not leaked and not changed and server_errors == 0,
        "names": len(names),
        "requests": sum(statuses.values()),
        "statuses": dict(sorted(statuses.items())),
        "accepted": len(accepted),
        "accepted_examples": accepted[:5],
        "server_errors": server_errors,
        "answers_showing_files_or_paths": len(leaked),
        "answers_showing_files_or_paths_examples": leaked[:3],
        "files_created_or_changed": len(changed),
        "valid_name_control": control,
    }


# --- headers ----------------------------------------------------------------------------------------


def headers(
    slow_clients: int = 200,
    idle_clients: int = 50,
    requests: int = 300,
    header_timeout: float | None = None,
    keep_alive: float | None = None,
) -> dict[str, Any]:
    """Oversize headers, byte-at-a-time and silent clients, idle keep-alive, and latency meanwhile.

    ``header_timeout`` and ``keep_alive`` default to the server's defaults (10 s and 15 s).
    """
    flags = []
    if header_timeout is not None:
        flags += ["--header-timeout", f"{header_timeout:g}"]
    if keep_alive is not None:
        flags += ["--keep-alive-timeout", f"{keep_alive:g}"]
    with serving(*flags) as site:
        from server.settings import Settings

        defaults = Settings.model_fields
        deadline = header_timeout or defaults["header_timeout_seconds"].default
        idle_limit = keep_alive or defaults["keep_alive_seconds"].default
        oversize = {}
        for size in (32 << 10, 100 << 10, 1 << 20, 4 << 20):
            status, _ = _raw(site, "GET", b"/healthz", {"X-Big": "a" * size})
            oversize[f"{size >> 10} KiB"] = status if status is not None else "closed"
        _latencies(site, requests)  # warm-up: the plan's tables, the step cache's first entries
        baseline = _latencies(site, requests)
        ends: list[tuple[float, int | None]] = []  # per client: seconds until the server ended it, and how
        lock = threading.Lock()
        stop = threading.Event()
        request = _request_bytes("GET", b"/healthz", {"X-Slow": "s" * 200})

        def hold(dribble: bool) -> None:
            """Sends ``request`` a byte every 0.5 s (~2 minutes in all), or nothing, until the server acts."""
            started = time.monotonic()
            pending = list(request) if dribble else []
            with _connect(site) as sock:
                sock.settimeout(0.5)
                while not stop.is_set():
                    try:
                        if pending:
                            sock.sendall(bytes([pending.pop(0)]))
                        answer = sock.recv(65536)  # an answer, or b"" (closed)
                    except TimeoutError:
                        continue
                    except (BrokenPipeError, ConnectionResetError):
                        answer = b""
                    with lock:
                        ends.append((time.monotonic() - started, _status(answer)))
                    return

        threads = [
            threading.Thread(target=hold, args=(i < slow_clients,))
            for i in range(slow_clients + idle_clients)
        ]
        for thread in threads:
            thread.start()
        time.sleep(0.2)
        during = _latencies(site, requests)
        with _connect(site) as sock:  # an idle keep-alive connection after a whole request
            sock.sendall(_request_bytes("GET", b"/healthz", {}).replace(b"Connection: close\r\n", b""))
            answered = time.monotonic()
            sock.settimeout(idle_limit + IO_TIMEOUT)
            answer = _read_all(sock)
            keep_alive_closed = time.monotonic() - answered
        give_up = time.monotonic() + deadline + IO_TIMEOUT
        for thread in threads:
            thread.join(max(0.0, give_up - time.monotonic()))
        stop.set()  # whoever the server still holds lets go now
        for thread in threads:
            thread.join(IO_TIMEOUT)
    cut_after = [seconds for seconds, status in ends if status in (408, None)]
    held = len(threads) - len(cut_after)
    return {
        "ok": oversize["32 KiB"] == 200
        and all(s in (431, "closed") for k, s in oversize.items() if k != "32 KiB")
        and held == 0
        and max(cut_after, default=0) < deadline + 5
        and _status(answer) == 200
        and keep_alive_closed < idle_limit + 5,
        "oversize_header_statuses": oversize,
        "header_timeout_s": deadline,
        "slow_and_silent_clients": len(threads),
        "cut_off": len(cut_after),
        "cut_off_statuses": dict(Counter(str(status) if status else "closed" for _, status in ends)),
        "still_held": held,
        "cut_off_after_s": _spread(cut_after),
        "keep_alive_s": idle_limit,
        "idle_connection_closed_after_s": round(keep_alive_closed, 2),
        "latency_ms_alone": _spread([x * 1e3 for x in baseline]),
        "latency_ms_with_slow_clients": _spread([x * 1e3 for x in during]),
    }


def _latencies(site: Site, n: int) -> list[float]:
    """Seconds per GET /shards (new steps, the token), one keep-alive connection."""
    out = []
    with httpx.Client(base_url=site.url, headers=site.auth, timeout=IO_TIMEOUT) as client:
        client.get("/shards", params={"run": RUN, "host": 0, "step": 0})  # first use: verification
        for i in range(n):
            started = time.perf_counter()
            response = client.get("/shards", params={"run": RUN, "host": i % 2, "step": 1000 + i})
            out.append(time.perf_counter() - started)
            if response.status_code != 200:
                raise RuntimeError(f"/shards answered {response.status_code}: {response.text[:300]}")
    return out


def _spread(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
        "max": round(ordered[-1], 3),
    }


# --- bodies -------------------------------------------------------------------------------------------


def bodies(uploads: int = 8, upload_mb: int = 50) -> dict[str, Any]:
    """Unauthenticated uploads of ``upload_mb`` MB (no Content-Length, streamed), and capped bodies."""
    with serving() as site:
        _latencies(site, 5)  # the server as it is when serving
        rss_before = site.rss_mb()
        statuses: Counter[str] = Counter()
        sent = []

        def upload() -> None:
            chunk = b"x" * (1 << 20)
            head = b"POST /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            total = 0
            with _connect(site) as sock:
                try:
                    sock.sendall(head)
                    for _ in range(upload_mb):
                        sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
                        total += len(chunk)
                    sock.sendall(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                status = _status(_read_all(sock))
            statuses[str(status) if status is not None else "closed"] += 1
            sent.append(total)

        threads = [threading.Thread(target=upload) for _ in range(uploads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(IO_TIMEOUT * 4)
        rss_after = site.rss_mb()
        limit = 1 << 20
        big = json.dumps({**VALID_CREATE, "skip": [[i, i + 1] for i in range(0, 300_000, 2)]}).encode()
        declared, _ = _raw(site, "POST", b"/runs", {**site.auth, "Content-Type": "application/json"}, big)
        with httpx.Client(base_url=site.url, headers=site.auth, timeout=IO_TIMEOUT) as client:
            streamed = client.post(
                "/runs", content=iter([big[i : i + 65536] for i in range(0, len(big), 65536)])
            )
            small = client.post("/runs", json=VALID_CREATE)
    return {
        "ok": set(statuses) <= {"401", "closed"}
        and statuses["401"] > 0
        and max(sent) < upload_mb << 20
        and declared == 413
        and streamed.status_code == 413
        and small.status_code in (200, 201)
        and rss_after - rss_before < 50,
        "unauthenticated_uploads": uploads,
        "upload_mb": upload_mb,
        "statuses": dict(statuses),
        "mb_sent_before_the_server_closed": _spread([s / (1 << 20) for s in sent]),
        "server_rss_mb_before": round(rss_before, 1),
        "server_rss_mb_after": round(rss_after, 1),
        "capped_body_bytes": len(big),
        "cap_bytes": limit,
        "capped_declared_status": declared,
        "capped_streamed_status": streamed.status_code,
    }


# --- schemathesis ----------------------------------------------------------------------------------


def schemathesis_run(max_examples: int = 200) -> dict[str, Any]:
    """Generated requests (positive and negative data) for every operation, with the token."""
    import hypothesis
    import schemathesis
    from schemathesis.checks import positive_data_acceptance
    from schemathesis.generation import GenerationMode

    statuses: Counter[int] = Counter()
    failures: Counter[str] = Counter()
    examples: list[str] = []
    without_cases: list[str] = []
    with serving() as site:
        schema = schemathesis.openapi.from_url(
            f"{site.url}/openapi.json", headers=site.auth, timeout=IO_TIMEOUT
        )
        operations = [result.ok() for result in schema.get_all_operations()]
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                @hypothesis.settings(
                    max_examples=max_examples,
                    deadline=None,
                    database=None,
                    derandomize=True,
                    suppress_health_check=list(hypothesis.HealthCheck),
                    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                )
                @hypothesis.given(operation.as_strategy(generation_mode=mode, headers=site.auth))
                def send(case: Any) -> None:
                    response = case.call(base_url=site.url, timeout=IO_TIMEOUT)
                    statuses[response.status_code] += 1
                    try:
                        case.validate_response(response, excluded_checks=[positive_data_acceptance])
                    # Failed checks: one, or a FailureGroup (a BaseExceptionGroup); each counted by its kind.
                    except (Exception, BaseExceptionGroup) as error:
                        for kind in failure_kinds(error):
                            failures[kind] += 1
                        if len(examples) < 5:
                            examples.append(f"{case.method} {case.formatted_path}: {str(error)[:300]}")

                try:
                    send()
                except hypothesis.errors.Unsatisfiable:  # no invalid request exists (e.g. no parameters)
                    without_cases.append(f"{operation.label} {mode.value}")
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    return {
        "ok": server_errors == 0 and not failures,
        "operations": len(operations),
        "max_examples_per_operation_and_mode": max_examples,
        "requests": sum(statuses.values()),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_errors": server_errors,
        "check_failures": dict(failures),
        "operation_modes_without_cases": without_cases,
        "check_failure_examples": examples,
    }


def failure_kinds(error: BaseException) -> list[str]:
    """The failed checks in what ``Case.validate_response`` raised (a group of failures, or one)."""
    inner = getattr(error, "exceptions", None)
    return [type(e).__name__ for e in inner] if inner else [type(error).__name__]


DRILLS: list[tuple[str, Callable[[], dict[str, Any]]]] = [
    ("server-auth-matrix", auth_matrix),
    ("server-name-corpus", name_corpus),
    ("server-headers", headers),
    ("server-bodies", bodies),
    ("server-schemathesis", schemathesis_run),
]
