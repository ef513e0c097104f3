"""Helpers shared by the benchmarks: an embedded Redis, timing, output files."""

from __future__ import annotations

import csv
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
for p in (ROOT / "compactor", ROOT / "operator"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def descendants(pid: int) -> list[int]:
    """Child processes (recursively) of ``pid``, from /proc: Spark's JVM and its Python workers."""
    parents: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            parents.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in parents.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def start_redis():
    from kompaktor.local.redis_server import RedisProcess

    return RedisProcess(tempfile.mkdtemp(prefix="kompaktor-bench-redis-")).start()


def write_csv(name: str, rows: list[dict]) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / name
    if rows:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]
