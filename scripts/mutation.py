"""Kill every guard: remove one condition at a time and run the tests that must catch it
(``make mutation``; docs/verification.md, "Guards killed by mutation").

Each mutant names one guard — a condition in the metadata's Lua library (``lua/mutate.lua``,
the fenced write, the queues' fencing, the lease) or in Python (the broker's checks, the
collector's sparing of backed-up files, the drain mark) — the exact text that is the guard, what
replaces it, and the tests that must fail without it. The mutant is applied to a copy of
``compactor/`` in a temporary directory, never to the tree: the tests run against the copy
(``PYTHONPATH`` and pytest's ``pythonpath`` point at it), and a Lua mutant's library gets a name of
its own (the name carries the code's digest, :mod:`kompaktor.redisfunctions`), so each test
session's fresh redis-server loads the mutated library. The tests first run against the
unmutated copy: a guard is killed only if its tests pass there and fail on the mutant.

    python scripts/mutation.py            # every mutant; exit 1 when one survives
    python scripts/mutation.py --list     # the mutants and their tests
    python scripts/mutation.py above_horizon fencing_mutate
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "compactor/kompaktor"
DSD = "tests/integration/test_deletes_stay_deleted.py"
RIGHTS = "tests/integration/test_compactor_rights.py"
FENCING = "tests/integration/test_fencing.py"
WORKER = "tests/integration/test_worker.py"
BACKUP = "tests/integration/test_backup_restore.py"
STORE = "tests/integration/test_store.py"
EACH = "test_each_condition_rejects_by_name_and_changes_nothing"
#: the deletes-stay-deleted state machine (its Arrow run)
MODEL = f"{DSD}::test_deletes_stay_deleted_arrow"


@dataclass(frozen=True)
class Mutant:
    """One guard removed: ``original`` (found exactly once in ``path``) becomes ``replacement``."""

    name: str
    path: str  # under compactor/kompaktor
    original: str
    replacement: str
    tests: tuple[str, ...]


MUTANTS = (
    Mutant(
        "above_horizon",
        "metadata/lua/mutate.lua",
        "if not isnull(doc.dh) and c[2] <= doc.dh then",
        "if false then",
        (f"{DSD}::test_redis_refuses_a_put_below_a_horizon_raised_after_the_python_check",),
    ),
    Mutant(
        "hides_nothing",
        "metadata/lua/mutate.lua",
        "if f then return fail('deletes hide a new file', t.id, f) end",
        "",
        (f"{DSD}::test_a_full_compaction_does_not_commit_over_a_file_it_would_hide",),
    ),
    Mutant(
        "horizon_raised_by_full_compactions",
        "metadata/lua/mutate.lua",
        "if full then doc.dh = tmax(doc.dh, dm) end",
        "",
        (MODEL,),
    ),
    Mutant(  # refusing too much: a partial compaction drops no marker, yet raises the horizon
        "horizon_only_from_full_compactions",
        "metadata/lua/mutate.lua",
        "if full then doc.dh = tmax(doc.dh, dm) end",
        "doc.dh = tmax(doc.dh, dm)",
        (MODEL,),
    ),
    Mutant(  # the model once passed with every commit refused and the conflict swallowed
        "commits_can_succeed",
        "metadata/compactions.py",
        'tc.require("range", encode_row(res.prev))',
        'tc.require("range", encode_row(res.prev)).require("no_running")',
        (MODEL,),
    ),
    Mutant(
        "fencing_mutate",
        "metadata/lua/mutate.lua",
        "if not isnull(spec.fence) and tonumber(redis.call('GET', K.fence) or '0') > spec.fence then",
        "if false then",
        (f"{FENCING}::test_a_replaced_leader_changes_nothing",),
    ),
    Mutant(
        "fencing_plain_writes",
        "metadata/store/base.py",
        "if cur > tok then",
        "if false then",
        (f"{FENCING}::test_a_replaced_leader_changes_nothing",),
    ),
    Mutant(
        "fencing_queues",
        "queues/lua/lib.lua",
        "if token ~= '' and tonumber(redis.call('GET', K.fence) or '0') > tonumber(token) then",
        "if false then",
        (f"{FENCING}::test_a_replaced_leader_changes_nothing",),
    ),
    Mutant(
        "reservation_secret",
        "coordinator/broker.py",
        "if not secrets.compare_digest(known[0], digest(req.cap)):",
        "if False:",
        (f"{RIGHTS}::test_only_the_holder_may_commit_release_or_heartbeat_a_compaction",),
    ),
    Mutant(
        "group_token",
        "coordinator/broker.py",
        "if self.group_key is not None and not holds(self.group_key, group, token):",
        "if False:",
        (f"{RIGHTS}::test_with_a_group_key_a_compactor_reserves_and_speaks_for_its_own_group_only",),
    ),
    Mutant(
        "broker_recorded_reservation",
        "coordinator/broker.py",
        'out.records.append((keyspace.reservation_key(res.ecid), json.dumps({"res": doc, "cap": cap_digest})))',
        "pass",
        (
            f"{RIGHTS}::test_only_the_holder_may_commit_release_or_heartbeat_a_compaction",
            f"{RIGHTS}::test_a_reservations_record_goes_soon_after_its_compaction_ends",
        ),
    ),
    Mutant(
        "gc_waits_for_a_backup",
        "coordinator/gc.py",
        "if store.files.backup_running():",
        "if False:",
        (f"{BACKUP}::test_no_garbage_collected_while_a_backup_is_taken",),
    ),
    Mutant(
        "gc_spares_backed_up_files",
        "coordinator/gc.py",
        "if rel not in spared and not (since is not None and written[rel] >= since and backup.is_write(rel))",
        "if True",
        (f"{BACKUP}::test_restore_after_losing_every_redis_node",),
    ),
    Mutant(
        "drain_flag",
        "worker/compactor.py",
        "if self.store.fleet.drain_requested(self.settings.compactor_id):",
        "if False:",
        (f"{WORKER}::test_drain_flag_in_redis_stops_an_idle_compactor",),
    ),
    Mutant(
        "drain_mark",
        "worker/compactor.py",
        "self.jobs.mark_drained(self.settings.group, self.settings.compactor_id)",
        "pass",
        (f"{WORKER}::test_a_drained_compactor_pod_stays_drained_across_a_container_restart[http]",),
    ),
    Mutant(  # a mutation resent after a broken connection must not be applied twice
        "mutation_applied_once",
        "metadata/lua/mutate.lua",
        "local prev = redis.call('GET', done_key)\n    if prev then return prev end",
        "",
        (f"{STORE}::test_a_resent_mutation_is_not_applied_twice",),
    ),
    Mutant(
        "drain_mark_kept_on_exit",
        "worker/compactor.py",
        "keep = self.drain.is_set() and self.settings.stay_drained",
        "keep = False",
        (f"{WORKER}::test_a_drained_compactor_pod_stays_drained_across_a_container_restart[redis]",),
    ),
)


#: what a copy of the tree leaves out (the virtualenv is linked, not copied)
_SKIP = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache", "out"
)


def _condition(name: str, message: str, tests: tuple[str, ...]) -> Mutant:
    """A condition of ``lua/mutate.lua`` that no longer refuses: its ``fail`` is called, not
    returned, so the mutation goes on as if the condition held."""
    return Mutant(name, "metadata/lua/mutate.lua", f"return fail('{message}'", f"local _ = fail('{message}'", tests)


#: every tablet and table condition of mutate.lua with a message of its own, and the test that
#: makes each one refuse
CONDITIONS = tuple(
    _condition(f"condition_{cond}", message, (f"{STORE}::{test}",))
    for cond, message, test in (
        ("files_free", "files not compacting", EACH),
        ("files_exactly", "files unchanged", EACH),
        ("no_running", "no running compactions", EACH),
        ("no_op", "no operation in progress", EACH),
        ("no_hold", "no user compaction pending", EACH),
        ("hold_is", "user compaction pending", EACH),
        ("no_selection", "no selection", EACH),
        ("files_in_selection", "files selected", EACH),
        ("files_not_selected", "files not selected", EACH),
        ("version", "tablet unchanged", EACH),
        ("state_in", "table state", "test_table_conditions_reject_by_name"),
    )
)


def _copy(dest: Path, mutant: Mutant | None) -> Path:
    """A copy of the tree at ``dest``, with ``mutant`` applied (its original text must occur
    exactly once: a guard whose text changed is reported, not silently skipped). The whole tree,
    not only compactor/: tests that start processes point them at their own tree's package."""
    shutil.copytree(ROOT, dest, ignore=_SKIP)
    (dest / ".venv").symlink_to(ROOT / ".venv")
    if mutant is not None:
        target = dest / PKG / mutant.path
        text = target.read_text()
        if text.count(mutant.original) != 1:
            raise SystemExit(
                f"mutant {mutant.name}: its guard's text occurs {text.count(mutant.original)} times "
                f"in {PKG}/{mutant.path}, not once: update scripts/mutation.py"
            )
        target.write_text(text.replace(mutant.original, mutant.replacement))
    return dest


def _run_tests(tree: Path, tests: tuple[str, ...], log: Path) -> bool:
    """Whether ``tests`` pass in the copy ``tree`` (output in ``log``)."""
    # no shrinking of a failing property-based run: a kill needs the failure, not its smallest case
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree / 'compactor'}{os.pathsep}{tree / 'operator'}",
        "KOMPAKTOR_NO_SHRINK": "1",
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    with log.open("w") as out:
        return subprocess.run(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT).returncode == 0


def _baseline(chosen: list[Mutant], work: Path) -> bool:
    """Whether each chosen mutant's tests pass on the unmutated copy, run as the mutant's will be
    (the same tests in one session: else a kill means nothing)."""
    ok = True
    for n, tests in enumerate(dict.fromkeys(m.tests for m in chosen)):
        log = work / f"base-{n}.log"
        if not _run_tests(_copy(work / "base", None), tests, log):
            print(f"the tests fail WITHOUT any mutation: {' '.join(tests)} (see {log})", flush=True)
            ok = False
        shutil.rmtree(work / "base")
    return ok


def _judge(m: Mutant, work: Path) -> bool:
    """Run ``m``'s tests on the mutant; whether it is killed (one of them fails)."""
    t0 = time.monotonic()
    killed = not _run_tests(_copy(work / m.name, m), m.tests, work / f"{m.name}.log")
    shutil.rmtree(work / m.name)
    by = ", ".join(t.split("::")[-1] for t in m.tests)
    print(f"  {m.name:28s} {'killed' if killed else 'SURVIVED':8s} {time.monotonic() - t0:5.1f}s  by {by}", flush=True)
    if killed:  # how: the test that failed and pytest's first line of why
        lines = (work / f"{m.name}.log").read_text().splitlines()
        test = next((ln for ln in lines if ln.startswith(("FAILED", "ERROR"))), "?")
        why = next((ln for ln in lines if ln.startswith("E ")), "E ?")
        print(f"      {test.split('::')[-1]}: {why[1:].strip()[:120]}", flush=True)
    return killed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="remove one guard at a time; its tests must fail")
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    args = ap.parse_args(argv)
    known = {m.name: m for m in (*MUTANTS, *CONDITIONS)}
    if unknown := [n for n in args.names if n not in known]:
        ap.error(f"no mutant named {', '.join(unknown)} (known: {', '.join(known)})")
    chosen = [known[n] for n in args.names] or list(known.values())
    if args.list:
        for m in chosen:
            print(f"{m.name}: {PKG}/{m.path}: {m.original!r}\n    " + "\n    ".join(m.tests), flush=True)
        return 0
    work = Path(tempfile.mkdtemp(prefix="kompaktor-mutation-"))
    print(f"{len(chosen)} mutants (logs in {work})", flush=True)
    if not _baseline(chosen, work):
        return 2
    survived = [m.name for m in chosen if not _judge(m, work)]
    if survived:
        print(f"not killed: {', '.join(survived)}", flush=True)
        return 1
    print(f"all {len(chosen)} mutants killed", flush=True)
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
