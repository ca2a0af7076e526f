"""The server's typed settings, read once from ``TASKDATA_SERVER_*`` environment variables or the CLI.

The bearer token comes from ``TASKDATA_SERVER_TOKEN`` or from a file (``TASKDATA_SERVER_TOKEN_FILE``,
``taskdata serve --token-file``), never from a command-line value (visible to every user of the machine
in the process list). It is held as a ``SecretStr``, so printing or logging the settings shows ``**********``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from taskdata.config import Config

__all__ = ["Settings", "get_settings"]


def _default_cache_root() -> str:
    return Config.from_environment().cache_root


class Settings(BaseSettings):
    """Everything the server is configured with; frozen (and hashable) once built."""

    model_config = SettingsConfigDict(env_prefix="TASKDATA_SERVER_", frozen=True, extra="forbid")

    cache_root: str = Field(
        default_factory=_default_cache_root,
        min_length=1,
        description="Cache root (local folder or gs://) holding task caches and _runs/.",
    )
    runs_file: str | None = Field(
        None, description="JSON list of run plans (RunPlan.to_dict() or run records)."
    )
    default_run: str | None = Field(
        None, description="Run served when /shards has no run parameter (default: the only run of runs_file)."
    )
    token: SecretStr | None = Field(None, description="Bearer token required on every route but /healthz.")
    token_file: str | None = Field(None, description="File holding the bearer token (instead of token).")
    modules: tuple[str, ...] = Field((), description="Python modules that register tasks and mixtures.")
    home: str | None = Field(None, description="taskdata's home folder (default: $TASKDATA_HOME, ~/.cache/taskdata).")
    c4_dir: str | None = Field(None, description="C4 folder of the built-in tasks (default: $TASKDATA_C4_DIR).")
    vocab: str | None = Field(None, description="Vocabulary of the built-in tasks (default: $TASKDATA_VOCAB).")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    step_cache_entries: int = Field(
        1024, ge=0, le=1_000_000, description="Serialized (run, data shard, step) answers kept in memory."
    )
    max_body_bytes: int = Field(
        1 << 20,
        ge=1024,
        le=1 << 30,
        description="Largest request body accepted (a POST /runs plan takes a few KB); larger ones get 413.",
    )
    max_header_bytes: int = Field(
        64 << 10,
        ge=1024,
        le=16 << 20,
        description="Largest request line plus headers accepted under 'taskdata serve'; larger ones get 431 "
        "(server.header_guard).",
    )
    header_timeout_seconds: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="Time a client has to send a request's line and headers, from its first byte (or from "
        "connecting); slower clients get 408 and are disconnected.",
    )
    keep_alive_seconds: float = Field(
        15.0,
        gt=0,
        le=3600,
        description="How long an idle connection is kept open between requests.",
    )
    run_refresh_seconds: float = Field(
        5.0,
        ge=0,
        le=3600,
        description="How often a stored run's file is read again, to see stages appended by another "
        "replica or by 'taskdata plan --add-stage'.",
    )
    run_reserve_steps: int = Field(
        64,
        ge=1,
        le=1_000_000,
        description="Steps a server reserves past a request for a stored run's steps beyond its served_before "
        "(one write of the run's record per this many steps): a new stage must start after the last step "
        "served plus up to this many.",
    )
    first_use_wait_seconds: float = Field(
        20.0,
        ge=0,
        le=3600,
        description="How long a request waits for a run's first verification before a 503.",
    )
    first_use_check: Literal["full", "listing"] = Field(
        "full",
        description="How a run's caches are verified on first use: 'full' re-reads every byte; 'listing' "
        "checks COMPLETED, every file's size and every offsets sidecar, reading no record (for caches "
        "verified by their build or 'taskdata verify'; trainers verify every record they read).",
    )
    verify_workers: int = Field(
        4, ge=1, le=256, description="Threads that verify shards (full) on first use."
    )

    @model_validator(mode="before")
    @classmethod
    def _read_token_file(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not data.get("token_file"):
            return data
        if data.get("token"):
            raise ValueError("Give the bearer token either as token or as token_file, not both.")
        path = Path(data["token_file"])
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise ValueError(f"Cannot read the token file {path}: {error.strerror}.") from None
        if not token:
            raise ValueError(f"The token file {path} is empty; put the bearer token in it.")
        return {**data, "token": token}

    @model_validator(mode="after")
    def _check_token(self) -> Settings:
        if self.token is not None and not self.token.get_secret_value().strip():
            raise ValueError("The bearer token is empty; set a non-empty token or none at all.")
        return self


    def config(self) -> Config:
        """What the built-in tasks read: these settings, else ``$TASKDATA_*``, else the defaults."""
        return Config.from_environment(home=self.home, c4_dir=self.c4_dir, vocab=self.vocab)


@functools.cache
def get_settings() -> Settings:
    """The process's settings, from the environment (tests override this dependency)."""
    return Settings()
