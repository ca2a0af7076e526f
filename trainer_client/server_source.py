"""``ServerAssignments``: read instructions from the assignment server (``GET /shards``), with retries.

The run's plan comes from ``GET /runs/{name}``; its fingerprint, recomputed here, must equal the one
the server states (client and server run the same index math version). Every ``/shards`` answer is
checked against what was asked (run, fingerprint, data shard, steps), so a confused server or proxy
can never make a host train on other steps than it asked for. Answers are asked for in ``encoding=compact``;
a server older than it refuses that parameter alone (422), and the client then asks in ``base64``. An answer's fingerprint covers the plan
as far as it decides the answer's steps (``RunPlan.fingerprint_before``); when it is not this plan's,
the plan is fetched again, and adopted if it differs only from the answer's first step on (a stage was
appended ahead of this trainer): the trainer goes on under the new stage without a restart.

A brief outage (connection refused, timeouts, 502/503/504 from a load balancer or from a server
still verifying a cache, whose Retry-After is honoured) is retried with exponential backoff until
``retry_seconds`` have passed; then the last error is raised. Other answers (400, 401, 404) are
raised at once, with the server's message.

A host slice ``index`` of ``count`` is asked for as ``host=index&num_hosts=count``; ``count`` must divide
the plan's ``num_data_shards`` (D). With fewer hosts than D (e.g. after resuming on a smaller slice),
the server computes the host's D / count consecutive data shards as one slice. Answers are decoded with
``taskdata.index.from_json`` into the same value ``LocalAssignments`` computes.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any

from taskdata.index import MAX_LOOKAHEAD, PlanError, ReadsError, RunPlan, StepReads, from_json
from taskdata.index.columns import ColumnEncoding
from taskdata.runs import StoredRun
from trainer_client.assignments import AssignmentError, HostSlice, RunInfo

if TYPE_CHECKING:  # imported where it is used, as before
    import httpx

__all__ = ["RETRY_STATUSES", "ServerAssignments"]

RETRY_STATUSES = frozenset({502, 503, 504})


class ServerAssignments:
    """Instructions of run ``run`` from the server at ``url`` (e.g. ``http://127.0.0.1:8000``)."""

    def __init__(
        self,
        url: str,
        run: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retry_seconds: float = 300.0,
        first_backoff: float = 0.05,
        max_backoff: float = 5.0,
        encoding: ColumnEncoding = "compact",
    ):
        import httpx

        if encoding not in ("ints", "base64", "compact"):
            raise AssignmentError(
                f"encoding must be 'compact' (the default), 'base64' or 'ints' but got {encoding!r}."
            )
        # compact: about a sixth of base64's bytes per answer, which is most of what a server spends on one.
        self.encoding = encoding

        if not url.startswith(("http://", "https://")):
            raise AssignmentError(f"Server URL must start with http:// or https:// but got {url!r}.")
        self.url = url.rstrip("/")
        self.run = run
        self._retry_seconds = retry_seconds
        self._first_backoff = first_backoff
        self._max_backoff = max_backoff
        # Jitter spreads the retries of many hosts; it never affects what is read.
        self._jitter = random.Random(f"{url}|{run}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)
        self._info: RunInfo | None = None

    def run_info(self) -> RunInfo:
        if self._info is None:
            self._info = self._describe()
        return self._info

    def _describe(self) -> RunInfo:
        """The run as ``GET /runs/{run}`` describes it now, checked."""
        body = self._get(f"/runs/{self.run}", {})
        try:
            stored = StoredRun(RunPlan.from_dict(body["plan"]))
        except (PlanError, KeyError, TypeError) as error:
            raise AssignmentError(
                f"Server {self.url} describes run {self.run!r} with a plan this client cannot read: {error}. "
                "Use a client of the same taskdata version as the server."
            ) from None
        if stored.split != body.get("split"):
            raise AssignmentError(
                f"Server {self.url} gives run {self.run!r} split {body.get('split')!r} but its plan reads split "
                f"{stored.split!r}; the answer is inconsistent. Use a client of the same taskdata version as "
                "the server."
            )
        # The fingerprint covers the split: a checkpoint of a train run never resumes on validation.
        if stored.plan.fingerprint() != body.get("fingerprint"):
            raise AssignmentError(
                f"Server {self.url} gives run {self.run!r} fingerprint {body.get('fingerprint')!r} but its plan "
                f"has fingerprint {stored.plan.fingerprint()!r} here: client and server compute the index math "
                "differently. Use a client of the same taskdata version as the server."
            )
        return RunInfo(stored.plan, stored.split)

    def fetch(self, first_step: int, num_steps: int, host_slice: HostSlice) -> list[StepReads]:
        info = self.run_info()
        shards = info.plan.num_data_shards
        if shards % host_slice.count:
            raise AssignmentError(
                f"Run {self.run!r} splits every global batch into {shards} data shards, which cannot be "
                f"grouped into {host_slice.count} host slices. Use a number of hosts (data-parallel groups) "
                f"that divides {shards}, or create a run whose num_data_shards is a multiple of {host_slice.count}."
            )
        out: list[StepReads] = []
        for start in range(first_step, first_step + num_steps, MAX_LOOKAHEAD):
            count = min(MAX_LOOKAHEAD, first_step + num_steps - start)
            try:
                out += self._fetch_window(info, start, count, host_slice)
            except _PlanChanged as change:
                info = self._adopt(info, start, count, change.fingerprint)
                out += self._fetch_window(info, start, count, host_slice)
        return out

    def _adopt(self, info: RunInfo, start: int, count: int, fingerprint: str) -> RunInfo:
        """The run's plan fetched again, if it explains an answer for steps ``start..`` with ``fingerprint``
        and agrees with ``info`` on every step before ``start`` (all this trainer has been handed)."""
        fresh = self._describe()
        last = start + count - 1
        if (
            fresh.plan.fingerprint_before(start) != info.plan.fingerprint_before(start)
            or fresh.plan.fingerprint_before(last + 1) != fingerprint
        ):
            raise AssignmentError(
                f"Server {self.url} answered steps {start}..{last} of run {self.run!r} with fingerprint "
                f"{fingerprint}, where this trainer's plan has {info.plan.fingerprint_before(last + 1)}, and the "
                f"run's plan now (fingerprint {fresh.fingerprint}) "
                + (
                    "changes steps before step {start}, which this trainer may have trained already"
                    if fresh.plan.fingerprint_before(start) != info.plan.fingerprint_before(start)
                    else "does not explain that answer either"
                ).format(start=start)
                + ". The run changed under this trainer or the server is misconfigured; do not train on it."
            )
        self._info = fresh
        return fresh

    def _fetch_window(self, info: RunInfo, start: int, count: int, host_slice: HostSlice) -> list[StepReads]:
        shards = info.plan.num_data_shards
        params = {
            "run": self.run,
            "host": host_slice.index,
            "num_hosts": host_slice.count,
            "step": start,
            "steps": count,
            "encoding": self.encoding,
        }
        try:
            body = self._get("/shards", params)
        except _CompactRefused:
            # A server from before encoding=compact: the same reads in base64, from now on.
            self.encoding = params["encoding"] = "base64"
            body = self._get("/shards", params)
        where = f"/shards for run {self.run!r}, host slice {host_slice.index} of {host_slice.count}, steps {start}..{start + count - 1}"
        fingerprint = info.plan.fingerprint_before(start + count)
        if body.get("run") == self.run and isinstance(body.get("fingerprint"), str) and body["fingerprint"] != fingerprint:
            raise _PlanChanged(body["fingerprint"])
        expected = {
            "run": self.run,
            "fingerprint": fingerprint,
            "split": info.split,
            "host": host_slice.index,
            "num_hosts": host_slice.count,
            "data_shard": host_slice.index * (shards // host_slice.count),
            "num_data_shards": shards,
        }
        wrong = {key: body.get(key) for key, value in expected.items() if body.get(key) != value}
        if wrong:
            wanted = {key: expected[key] for key in wrong}
            raise AssignmentError(
                f"Server {self.url} answered {where} with {wrong} where {wanted} was expected. The run changed "
                "under this trainer or the server is misconfigured; do not train on it."
            )
        try:
            steps = [from_json(raw) for raw in body["steps"]]
        except (ReadsError, KeyError, TypeError) as error:
            raise AssignmentError(
                f"Server {self.url} answered {where} with read instructions this client refuses: {error} Use a "
                "client of the same taskdata version as the server; do not train on them."
            ) from None
        names = [[task.task for task in s.tasks] for s in steps]
        if any(n != list(info.plan.task_names) for n in names):
            raise AssignmentError(
                f"Server {self.url} lists tasks {names[0]} for run {self.run!r} whose plan reads "
                f"{list(info.plan.task_names)}; the answer does not belong to this run."
            )
        got = [s.step for s in steps]
        if got != list(range(start, start + count)):
            raise AssignmentError(
                f"Server {self.url} answered steps {got[:4]}{'...' if len(got) > 4 else ''} when asked for steps "
                f"{start}..{start + count - 1} of run {self.run!r}; refusing to read other steps than asked."
            )
        return steps

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        import httpx

        deadline = time.monotonic() + self._retry_seconds
        backoff = self._first_backoff
        attempts = 0
        while True:
            attempts += 1
            retry_after = None
            try:
                response = self._http.get(path, params=params)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
            else:
                if response.status_code == 200:
                    return response.json()
                detail = _detail(response)
                if response.status_code == 422 and params.get("encoding") == "compact" and _refuses_encoding(response):
                    raise _CompactRefused(detail)
                if response.status_code not in RETRY_STATUSES:
                    raise AssignmentError(
                        f"Server {self.url} refused GET {path} {params}: HTTP {response.status_code}: {detail}"
                    )
                problem = f"HTTP {response.status_code}: {detail}"
                retry_after = _seconds(response.headers.get("Retry-After"))
            # A server that says when to come back (503 while it verifies a cache) is taken at its
            # word, within the backoff ceiling.
            wait = backoff if retry_after is None else min(max(retry_after, backoff), self._max_backoff)
            if time.monotonic() + wait > deadline:
                raise AssignmentError(
                    f"Server {self.url} did not answer GET {path} {params} after {attempts} attempts over "
                    f"{self._retry_seconds:g} s; last problem: {problem}. Check that the server is running and "
                    "reachable from this host (or raise retry_seconds)."
                )
            time.sleep(wait * (0.5 + self._jitter.random()))
            backoff = min(backoff * 2, self._max_backoff)

    def close(self) -> None:
        self._http.close()


class _CompactRefused(Exception):
    """A 422 that refuses the query's ``encoding`` alone: a server older than encoding=compact."""


def _refuses_encoding(response: httpx.Response) -> bool:
    try:
        problems = response.json()["detail"]
        return bool(problems) and all(p["loc"] == ["query", "encoding"] for p in problems)
    except (ValueError, KeyError, TypeError):
        return False


class _PlanChanged(Exception):
    """An answer whose fingerprint is not the one this client's plan gives its steps."""

    def __init__(self, fingerprint: str):
        super().__init__(fingerprint)
        self.fingerprint = fingerprint


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: plain backoff is good enough


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
