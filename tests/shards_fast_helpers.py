"""Random ``GET /shards`` requests, shared by tests/test_server_fast.py and tests/test_server_door.py (not a
test module): it goes with them and with ``server.shards_fast``."""

from __future__ import annotations

import random

from server.models import MAX_STEP
from tests.server_helpers import TOKEN

__all__ = ["GOOD", "random_requests"]

GOOD = {"Authorization": f"Bearer {TOKEN}"}


def random_requests(seed: int, count: int) -> list[tuple[str, dict[str, str]]]:
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        params = [
            ("host", rng.choice(["0", "1", "2", "3", "4", "7", "9", "x", "-1", "01"])),
            ("step", rng.choice(["0", "1", "2", "3", "5", "9", "1000000", str(MAX_STEP), str(MAX_STEP - 2), "-1"])),
        ]
        for name, values in (
            ("steps", ["1", "2", "4", "64", "65", "0"]),
            ("run", ["mix", "solo", "nope", "_bad", "mix"]),
            ("num_hosts", ["1", "2", "4", "8", "3", "0"]),
            ("encoding", ["ints", "base64", "compact", "hex"]),
            ("bogus", ["1"]),
        ):
            if rng.random() < (0.05 if name == "bogus" else 0.4):
                params.append((name, rng.choice(values)))
        rng.shuffle(params)
        if rng.random() < 0.05:
            params.append(params[0])  # a parameter twice
        query = "&".join(f"{name}={value}" for name, value in params)
        headers = rng.choices([GOOD, {}, {"Authorization": f"Bearer {TOKEN}x"}], weights=(0.9, 0.05, 0.05))[0]
        requests.append((f"/shards?{query}", headers))
    return requests
