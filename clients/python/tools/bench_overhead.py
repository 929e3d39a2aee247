"""What the client adds over a bare httpx POST to the same pglimit, p50.

Issue 13 asks that a client add under 0.2 ms p50 over a bare request. Both
sides use one keep-alive httpx.Client and fresh ad hoc keys, interleaved in
rounds so that drift in the server or the machine hits both alike.

    PGLIMIT_BIN=target/release/pglimit clients/python/.venv/bin/python clients/python/tools/bench_overhead.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, List

import httpx

from pglimit import Pglimit

HERE = Path(__file__).resolve().parent.parent


def _addr(log: Path) -> str:
    for line in log.read_text(errors="replace").splitlines():
        try:
            fields = json.loads(line).get("fields", {})
        except ValueError:
            continue
        if isinstance(fields, dict) and fields.get("message") == "listening":
            return str(fields["addr"])
    return ""


def main(rounds: int = 20, per_round: int = 100) -> None:
    binary = os.environ.get("PGLIMIT_BIN") or str(HERE / "../../target/debug/pglimit")
    work = Path(tempfile.mkdtemp(prefix="pglimit-py-bench-"))
    work.chmod(0o755)
    log = work / "pglimit.log"
    env = {
        **os.environ,
        "PGLIMIT_DATA_DIR": str(work / "data"),
        "PGLIMIT_BIND": "127.0.0.1:0",
        "PGLIMIT_LOG_FORMAT": "json",
    }
    env.pop("DATABASE_URL", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen([binary], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 90
        while not (addr := _addr(log)):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"pglimit did not start:\n{log.read_text()}")
            time.sleep(0.05)
        url = f"http://{addr}"
        raw = httpx.Client()
        client = Pglimit(url)

        def bare() -> None:
            body = {"key": f"bench:{uuid.uuid4().hex}", "limit": 1000, "window": "1m", "cost": 1}
            raw.post(url + "/check", json=body).json()

        def sdk() -> None:
            client.check(key=f"bench:{uuid.uuid4().hex}", limit=1000, window="1m")

        cases: Dict[str, Callable[[], None]] = {"bare httpx": bare, "pglimit client": sdk}
        samples: Dict[str, List[float]] = {name: [] for name in cases}
        for fn in cases.values():
            for _ in range(per_round):
                fn()  # warm up: connections, caches
        for _ in range(rounds):
            for name, fn in cases.items():
                for _ in range(per_round):
                    started = time.perf_counter()
                    fn()
                    samples[name].append(time.perf_counter() - started)
        p50 = {name: statistics.median(values) * 1000 for name, values in samples.items()}
        for name, value in p50.items():
            print(f"{name:15} p50 {value:.3f} ms ({len(samples[name])} checks)")
        print(f"client overhead p50 {p50['pglimit client'] - p50['bare httpx']:+.3f} ms")
        raw.close()
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
