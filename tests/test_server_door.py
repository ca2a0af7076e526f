"""The protocol's door (``server.protocol``): ``GET /shards`` answered before any ASGI task, byte for byte as
uvicorn's cycle and the app answer it.

Two copies of the real protocol class run on one asyncio loop over a recording transport (no socket), each
with its own app over the same caches and runs (tests/server_helpers.py's): one with the door
(``limited_protocol(settings, app)``, what ``taskdata serve`` runs), one without (every request through
uvicorn's ``RequestResponseCycle`` and the app). The same request bytes must give the same response
bytes, the ``date`` header aside, and the same metrics.
"""

from __future__ import annotations

import asyncio
import re
from email.utils import formatdate

import pytest
from pydantic import SecretStr
from uvicorn.config import Config
from uvicorn.server import ServerState

from server.protocol import limited_protocol
from server.settings import Settings
from taskdata.cli import serve_options
from tests.helpers import metric_samples
from tests.server_helpers import TOKEN, server_env
from tests.server_helpers import make_app as service
from tests.shards_fast_helpers import random_requests

pytestmark = pytest.mark.slow  # cache jobs (Beam)

AUTH = f"authorization: Bearer {TOKEN}\r\n"
DATE = re.compile(rb"\r\ndate: [^\r]*\r\n")
SETTLE_SECONDS = 20.0  # how long a test waits for the app's answers before it fails

env = pytest.fixture(scope="module")(server_env)  # tests/server_helpers.py's caches and runs


class Transport:
    """What the protocol writes, and whether it closed the connection (an ``asyncio.Transport``'s surface
    that uvicorn's protocol uses)."""

    def __init__(self):
        self.written = bytearray()
        self.writes = 0
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data
        self.writes += 1

    def writelines(self, chunks) -> None:
        self.written += b"".join(chunks)
        self.writes += 1

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)


class Connection:
    """One connection of a protocol class, fed request bytes, read back as whole responses."""

    def __init__(self, protocol_class, app, server_state: ServerState):
        config = Config(app=app, http=protocol_class, ws="none", access_log=False, log_level="warning",
                        timeout_keep_alive=5)  # fmt: skip
        config.load()
        self.transport = Transport()
        self.protocol = protocol_class(config=config, server_state=server_state, app_state={},
                                       _loop=asyncio.get_running_loop())  # fmt: skip
        self.protocol.connection_made(self.transport)

    async def exchange(self, data: bytes, responses: int) -> list[bytes]:
        """Sends ``data``, then waits for ``responses`` whole responses (each with its Content-Length body)."""
        self.protocol.data_received(data)
        deadline = asyncio.get_running_loop().time() + SETTLE_SECONDS
        while len(split_responses(bytes(self.transport.written))) < responses:
            assert asyncio.get_running_loop().time() < deadline, bytes(self.transport.written)[:300]
            await asyncio.sleep(0.001)
        answered = split_responses(bytes(self.transport.written))
        del self.transport.written[:]
        assert len(answered) == responses, answered
        return answered


def split_responses(data: bytes) -> list[bytes]:
    """The whole responses in ``data``, each with its head's ``date`` value blanked."""
    responses = []
    while (end := data.find(b"\r\n\r\n")) >= 0:
        head = data[: end + 4]
        length = re.search(rb"\r\ncontent-length: (\d+)\r\n", head)
        size = end + 4 + (int(length.group(1)) if length else 0)
        if len(data) < size:
            break
        responses.append(DATE.sub(b"\r\ndate: -\r\n", data[:size], count=1))
        data = data[size:]
    return responses


def request(path: str, headers: str = AUTH, version: str = "1.1") -> bytes:
    return f"GET {path} HTTP/{version}\r\nhost: replica\r\n{headers}\r\n".encode()


class Pair:
    """The same requests to a protocol with the door and one without, each over its own app."""

    def __init__(self, env, **settings):
        self.door_app = service(env, token=SecretStr(TOKEN), **settings)
        self.plain_app = service(env, token=SecretStr(TOKEN), **settings)
        server_settings = Settings(cache_root=str(env.root))
        self.door_class = limited_protocol(server_settings, self.door_app)
        self.plain_class = limited_protocol(server_settings)
        self.answered_at_door = 0
        door = self.door_class.door

        def counting(headers, query_string):
            body = door(headers, query_string)
            self.answered_at_door += body is not None
            return body

        self.door_class.door = staticmethod(counting)
        self.states = ServerState(), ServerState()
        for state in self.states:  # what uvicorn's Server sets (and refreshes every second) before serving
            state.default_headers = [(b"date", formatdate(usegmt=True).encode()), (b"server", b"uvicorn")]

    def connections(self) -> tuple[Connection, Connection]:
        return (Connection(self.door_class, self.door_app, self.states[0]),
                Connection(self.plain_class, self.plain_app, self.states[1]))  # fmt: skip

    async def both(self, data: bytes, responses: int = 1) -> list[bytes]:
        fast, plain = self.connections()
        a, b = await fast.exchange(data, responses), await plain.exchange(data, responses)
        assert a == b, (data, a, b)
        assert (fast.transport.closed, fast.transport.reading) == (plain.transport.closed, plain.transport.reading)
        return a


def test_taskdata_serve_runs_the_protocol_with_its_apps_door(env):
    app = service(env)
    options = serve_options(Settings(cache_root=str(env.root)), app, access_log=False)
    assert options["http"].door == app.answer_now  # the bound method of the app uvicorn runs
    assert limited_protocol(Settings()).door is None  # an app without answer_now: no door


def test_the_door_answers_as_the_app_through_uvicorn_does(env):
    async def main():
        pair = Pair(env)
        first = await pair.both(request("/shards?host=0&step=0"))  # first use: resolved by the app
        assert first[0].startswith(b"HTTP/1.1 200 ")
        requests = random_requests(seed=23, count=300)
        statuses = []
        for path, headers in requests:
            header = "".join(f"{name.lower()}: {value}\r\n" for name, value in headers.items())
            statuses.append(int((await pair.both(request(path, header)))[0][9:12]))
        assert set(statuses) == {200, 400, 401, 404, 422}
        # The door answered part of the 200s (one step, valid, the run's caches found); the app the rest.
        assert pair.answered_at_door > 30 and statuses.count(200) - pair.answered_at_door > 5
        scrapes = [(await c.exchange(request("/metrics"), 1))[0] for c in pair.connections()]
        door_metrics, plain_metrics = (metric_samples(s.partition(b"\r\n\r\n")[2].decode()) for s in scrapes)
        for name in ("taskdata_http_requests_total", "taskdata_http_errors_total",
                     "taskdata_http_request_duration_seconds_count"):  # fmt: skip
            assert door_metrics[name] == plain_metrics[name], name

    asyncio.run(main())


def test_kept_alive_pipelined_and_closing_requests(env):
    async def main():
        pair = Pair(env)
        await pair.both(request("/shards?host=0&step=0"))
        fast, plain = pair.connections()
        # One connection, many requests, some in one read (pipelined), door and app mixed: answers in order.
        pipelined = (
            request("/shards?host=1&step=7")
            + request("/healthz", headers="")
            + request("/shards?host=2&step=7&encoding=compact")
            + request("/shards?host=3&step=7&steps=3")  # several steps: the app, in a thread
            + request("/shards?host=3&step=7")
            + request("/shards?host=9&step=7")  # 400 from the app
            + request("/shards?host=2&step=7&encoding=base64")
        )
        before = pair.answered_at_door
        a, b = await fast.exchange(pipelined, 7), await plain.exchange(pipelined, 7)
        assert a == b
        assert [r[:12] for r in a] == [b"HTTP/1.1 200"] * 5 + [b"HTTP/1.1 400", b"HTTP/1.1 200"]
        # The door answered the first; the rest waited behind the app's answer to /healthz, in uvicorn's queue.
        assert pair.answered_at_door == before + 1
        assert pair.states[0].total_requests == pair.states[1].total_requests == 8
        # After a door answer, as after the cycle's: the request counted, the keep-alive timer armed.
        fast, _ = pair.connections()
        before = pair.answered_at_door
        await fast.exchange(request("/shards?host=0&step=7"), 1)
        assert pair.answered_at_door == before + 1 and pair.states[0].total_requests == 9
        assert fast.protocol.timeout_keep_alive_task is not None and fast.transport.reading
        # Connection: close is honoured: the answer says so and the connection closes after it.
        before = pair.answered_at_door
        closing = await pair.both(request("/shards?host=1&step=8", AUTH + "connection: close\r\n"))
        assert b"\r\nconnection: close\r\n" in closing[0] and pair.answered_at_door == before + 1
        # HTTP/1.0 and a request with a body go to the cycle (the answers match all the same).
        await pair.both(request("/shards?host=1&step=9", version="1.0"))
        await pair.both(request("/shards?host=1&step=9", AUTH + "content-length: 2\r\n") + b"{}")
        assert pair.answered_at_door == before + 1
        # A wrong token never reaches the door's answer: the guard's 401.
        refused = await pair.both(request("/shards?host=1&step=10", "authorization: Bearer wrong\r\n"))
        assert refused[0].startswith(b"HTTP/1.1 401") and pair.answered_at_door == before + 1

    asyncio.run(main())


@pytest.mark.parametrize("setting", ["access_log", "root_path", "limit_concurrency"])
def test_uvicorn_options_the_door_does_not_mirror_send_requests_to_the_cycle(env, setting):
    async def main():
        pair = Pair(env)
        await pair.both(request("/shards?host=0&step=0"))
        fast, _ = pair.connections()
        value = {"access_log": True, "root_path": "/api", "limit_concurrency": 1000}[setting]
        setattr(fast.protocol, setting, value)
        before = pair.answered_at_door
        answer = await fast.exchange(request("/shards?host=1&step=3"), 1)
        assert pair.answered_at_door == before and answer[0][:12] in (b"HTTP/1.1 200", b"HTTP/1.1 404")

    asyncio.run(main())


def test_an_error_at_the_door_leaves_the_request_to_the_app(env, monkeypatch):
    def broken(state, **fields):
        raise RuntimeError("a bug in answer_now")

    async def main():
        pair = Pair(env)
        await pair.both(request("/shards?host=0&step=0"))
        monkeypatch.setattr("server.shards_fast.answer_now", broken)
        answers = await pair.both(request("/shards?host=1&step=4"))  # the app's answer, as without the door
        assert answers[0].startswith(b"HTTP/1.1 200 ") and pair.answered_at_door == 0

    asyncio.run(main())


def test_a_window_of_steps_kept_whole_is_answered_without_a_thread(env, monkeypatch):
    # A lookahead window (steps=4): its first hosts run the index math in a worker thread (the first
    # computes each step's slice alone, the second the whole step); once the steps are kept whole, the
    # other hosts' answers need only their JSON: written at once, at the door, with no thread's round trip.
    import anyio.to_thread

    threads = []
    real = anyio.to_thread.run_sync

    async def counting(function, *args, **kwargs):
        threads.append(function)
        return await real(function, *args, **kwargs)

    async def main():
        pair = Pair(env)
        await pair.both(request("/shards?host=0&step=0"))
        monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
        before = pair.answered_at_door
        for host in range(2):
            await pair.both(request(f"/shards?host={host}&step=40&steps=4&encoding=compact"))
        assert (len(threads), pair.answered_at_door) == (4, before)  # two hosts, two apps
        for host in range(2, 4):
            answers = await pair.both(request(f"/shards?host={host}&step=40&steps=4&encoding=compact"))
            assert answers[0].startswith(b"HTTP/1.1 200 ")
        assert (len(threads), pair.answered_at_door) == (4, before + 2)

    asyncio.run(main())
