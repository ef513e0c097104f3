"""The metadata store's parts (kompaktor.metadata.store): one MetadataStore composed of named
parts, each a class of its own module. No server: what is checked is the composition — no part
inherits from another, every operation is defined once, the store itself keeps only what is about
all of it, a fenced store is fenced in every part, every part's scripts are in the one library
(and loaded by load_scripts)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from kompaktor.metadata import store as store_pkg
from kompaktor.metadata.store import LIBRARY, PARTS, MetadataStore, Mutation, StoreCore, TabletChange
from kompaktor.metadata.store.base import library
from kompaktor.metadata.store.mutation import Mutation as MutationDef
from kompaktor.model.errors import StoreUnavailable
from kompaktor.queues.jobqueue import JobQueues
from kompaktor.redisfunctions import LuaLibrary

#: what the store itself keeps: the entry points about all of it
CROSS_CUTTING = {
    "from_url",
    "close",
    "ping",
    "load_scripts",
    "fenced",
    "apply",
    "mutate",
    "durable",
    "call",
    "reserve_next",
    "next_seq",
    "url",
    "durability",
}


def _operations(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_") and n not in ("SCRIPTS",)}


def _store(client: Any, url: str = "") -> MetadataStore:
    return MetadataStore(client, url)


def test_each_part_is_a_class_of_its_own_module_and_inherits_from_no_other() -> None:
    assert set(PARTS) == {"tables", "files", "running", "ucomps", "bookkeeping", "lease", "fleet"}
    # one module each, named for the part
    assert {name: cls.__module__ for name, cls in PARTS.items()} == {
        name: f"kompaktor.metadata.store.{name}" for name in PARTS
    }
    for name, cls in PARTS.items():
        assert cls.__bases__ == (object,), name  # no part is another part, nor the core
        assert inspect.getdoc(inspect.getmodule(cls)) and inspect.getdoc(cls), name
    assert StoreCore.__bases__ == (object,) and MetadataStore.__bases__ == (object,)


def test_a_part_gets_the_parts_it_needs_when_it_is_made() -> None:
    needs = {name: list(inspect.signature(cls).parameters) for name, cls in PARTS.items()}
    assert needs == {
        "tables": ["core"],
        "files": ["core", "tables"],
        "running": ["core"],
        "ucomps": ["core"],
        "bookkeeping": ["core"],
        "lease": ["core"],
        "fleet": ["core", "tables", "bookkeeping"],
    }
    store = _store(_Client())
    assert store.files._tables is store.tables
    assert store.fleet._tables is store.tables and store.fleet._bookkeeping is store.bookkeeping


def test_every_operation_is_defined_once() -> None:
    owners: dict[str, list[str]] = {}
    for cls in [*PARTS.values(), StoreCore]:
        for name in _operations(cls):
            owners.setdefault(name, []).append(cls.__name__)
    parts_only = {n: o for n, o in owners.items() if "StoreCore" not in o}
    assert len(parts_only) > 70
    assert {n: o for n, o in parts_only.items() if len(o) > 1} == {}


def test_the_store_keeps_only_the_cross_cutting_entry_points_and_its_parts() -> None:
    assert _operations(MetadataStore) == CROSS_CUTTING
    store = _store(_Client())
    public = {n for n in vars(store) if not n.startswith("_")}
    assert public == {*PARTS, "queues"}
    for name, cls in PARTS.items():
        assert type(getattr(store, name)) is cls
    assert isinstance(store.queues, JobQueues)
    flat = {n for cls in PARTS.values() for n in _operations(cls)}
    assert not [n for n in flat if hasattr(store, n) and n not in PARTS]  # no shims of the parts' methods


def test_each_operation_lives_in_the_part_named_for_its_concern() -> None:
    where = {
        "create_table": "tables",
        "tablet_batches": "tables",
        "add_files": "files",
        "imports_since": "files",
        "put_heartbeat": "running",
        "count_failure": "running",
        "user_compaction": "ucomps",
        "pop_dirty": "bookkeeping",
        "incr": "bookkeeping",
        "acquire_lease": "lease",
        "put_group": "fleet",
        "request_drain": "fleet",
    }
    for name, part in where.items():
        assert name in vars(PARTS[part]), name
    assert {"apply", "call", "write", "reserve_next"} <= _operations(StoreCore)
    assert Mutation is MutationDef and TabletChange.__module__ == "kompaktor.metadata.store.mutation"
    assert StoreCore.scan_chunk == store_pkg.SCAN_CHUNK


class _Client:
    """Records the function libraries loaded; Redis itself is never called."""

    def __init__(self, held: tuple[str, ...] = ()) -> None:
        self.held = set(held)
        self.loaded: list[str] = []

    def pipeline(self, transaction: bool = False) -> Any:
        return _Pipe(self)

    def function_load(self, code: str) -> None:
        name = code.split("\n", 1)[0].removeprefix("#!lua name=")
        self.loaded.append(name)
        self.held.add(name)


class _Pipe:
    def __init__(self, client: _Client) -> None:
        self.client, self.asked = client, []

    def function_list(self, library: str) -> None:
        self.asked.append(library)

    def execute(self) -> list[Any]:
        return [[{"library_name": n}] if n in self.client.held else [] for n in self.asked]


def test_every_parts_scripts_are_functions_of_the_stores_library_and_loaded() -> None:
    client = _Client(held=tuple(lib.name for lib in JobQueues.libraries()))
    store = _store(client)
    names = {"_mutate", "_reserve", "_fenced_write", "_lease_acquire", "_lease_renew", "_lease_release", "_failures"}
    assert set(LIBRARY.functions) == names
    declared = {n for cls in (StoreCore, *PARTS.values()) for n in vars(cls).get("SCRIPTS", {})}
    assert declared == names
    bound = {
        "_mutate": store._core._mutate,
        "_reserve": store._core._reserve,
        "_fenced_write": store._core._fenced_write,
        "_lease_acquire": store.lease._lease_acquire,
        "_lease_renew": store.lease._lease_renew,
        "_lease_release": store.lease._lease_release,
        "_failures": store.running._failures,
    }
    for name, fn in bound.items():
        assert fn.name == LIBRARY.function_name(name)
        assert f"redis.register_function('{LIBRARY.function_name(name)}'" in LIBRARY.code
    assert store.load_scripts() == 1 and client.loaded == [LIBRARY.name]  # the queues' library is held
    assert store.load_scripts() == 0  # nothing missing: nothing loaded


def test_a_script_name_two_parts_declare_is_refused() -> None:
    class Twice:
        SCRIPTS = {"_failures": "return 1"}

    with pytest.raises(ValueError, match=r"scripts named twice: \['_failures'\]"):
        library(*PARTS.values(), Twice)


def test_a_librarys_name_follows_its_code() -> None:
    """Two versions side by side (an upgrade) run their own code: a change to any body or to the
    preamble names another library."""
    a = LuaLibrary("t", "local K = 1", {"f": "return K"})
    assert LuaLibrary("t", "local K = 1", {"f": "return K"}).name == a.name
    assert LuaLibrary("t", "local K = 2", {"f": "return K"}).name != a.name
    assert LuaLibrary("t", "local K = 1", {"f": "return K + 1"}).name != a.name
    assert a.code.startswith(f"#!lua name={a.name}\n") and a.function_name("f") == f"{a.name}_f"
    with pytest.raises(KeyError):
        a.bind(None, "g")  # type: ignore[arg-type]


def test_a_fenced_store_is_fenced_in_every_part_on_the_same_connection() -> None:
    client = _Client()
    store = _store(client, "redis://127.0.0.1:6390/0")
    view = store.fenced(lambda: 7)
    assert type(view) is MetadataStore and view.url == store.url
    assert view._core is not store._core and view._core.client is client
    for name in PARTS:
        assert getattr(view, name) is not getattr(store, name)
        assert getattr(view, name)._core is view._core and getattr(store, name)._core is store._core
    assert view.queues is not store.queues and view.queues._token() == "7" and store.queues._token() == ""
    assert view._core.token() == "7" and store._core.token() == ""


def test_a_fenced_store_keeps_an_explicit_durability() -> None:
    from kompaktor.connection import Durability

    strict = Durability("replicas:2")
    store = MetadataStore(_Client(), "redis://127.0.0.1:6390/0", durability=strict)  # type: ignore[arg-type]
    view = store.fenced(lambda: 7)
    assert view.durability is strict and view._core.durability is strict


class _Server:
    """A primary of a given Redis version; nothing else is asked of it."""

    def __init__(self, version: str) -> None:
        self.version = version

    def ping(self) -> bool:
        return True

    def info(self, section: str) -> dict[str, Any]:
        return {"role": "master"} if section == "replication" else {"redis_version": self.version}


def test_a_redis_without_functions_is_refused_in_one_line() -> None:
    """Redis 6 has no function libraries: the store says so when it starts, not at the first call."""
    store = _store(_Server("6.2.14"), "redis://:secret@127.0.0.1:6390/0")
    with pytest.raises(StoreUnavailable) as err:
        store.ping()
    assert str(err.value) == (
        "Redis at redis://***@127.0.0.1:6390/0 is version 6.2.14: Kompaktor needs Redis >= 7.0 "
        "(its code runs as Redis functions)"
    )
