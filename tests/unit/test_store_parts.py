"""The metadata store's parts (kompaktor.metadata.store): one MetadataStore made of modules by
concern. No server: what is checked is the composition — every operation defined once, in the
part named for its concern, every part's scripts registered (and loaded by load_scripts), a
fenced view of the same make."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from kompaktor.metadata import store as store_pkg
from kompaktor.metadata.store import MetadataStore, Mutation, StoreBase, TabletChange
from kompaktor.metadata.store.mutation import Mutation as MutationDef
from kompaktor.model.errors import StoreUnavailable
from kompaktor.queues.jobqueue import JobQueues
from kompaktor.redisfunctions import LuaLibrary

PARTS = [c for c in MetadataStore.__mro__ if c not in (MetadataStore, object)]


def _defined_in(name: str) -> list[type]:
    return [c for c in PARTS if name in vars(c)]


def test_every_operation_is_defined_in_one_part() -> None:
    names = {n for c in PARTS for n in vars(c) if not n.startswith("__") and n not in ("SCRIPTS", "scan_chunk")}
    assert len(names) > 80
    twice = {n: [c.__name__ for c in _defined_in(n)] for n in names if len(_defined_in(n)) > 1}
    assert twice == {}
    assert not [n for n in vars(MetadataStore) if not n.startswith("__")]  # the parts only


def test_each_part_is_a_module_named_for_its_concern() -> None:
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
        "apply": "base",
        "call": "base",
    }
    for name, module in where.items():
        (cls,) = _defined_in(name)
        assert cls.__module__ == f"kompaktor.metadata.store.{module}", name
        assert inspect.getdoc(inspect.getmodule(cls))
    assert Mutation is MutationDef and TabletChange.__module__ == "kompaktor.metadata.store.mutation"
    assert issubclass(MetadataStore, StoreBase) and MetadataStore.scan_chunk == store_pkg.SCAN_CHUNK


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
    store = MetadataStore(client)  # type: ignore[arg-type]
    lib = store.library()
    names = ("_mutate", "_reserve", "_fenced_write", "_lease_acquire", "_lease_renew", "_lease_release", "_failures")
    assert sorted(lib.functions) == sorted(names)
    for name in names:
        assert getattr(store, name).name == lib.function_name(name)
        assert f"redis.register_function('{lib.function_name(name)}'" in lib.code
    assert store.load_scripts() == 1 and client.loaded == [lib.name]  # the queues' library is held
    assert store.load_scripts() == 0  # nothing missing: nothing loaded


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


def test_a_fenced_view_is_a_whole_store_on_the_same_connection() -> None:
    client = _Client()
    store = MetadataStore(client, "redis://127.0.0.1:6390/0")  # type: ignore[arg-type]
    view = store.fenced(lambda: 7)
    assert type(view) is MetadataStore and view._r is client and view.url == store.url
    assert view._token() == "7" and store._token() == ""


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
    store = MetadataStore(_Server("6.2.14"), "redis://:secret@127.0.0.1:6390/0")  # type: ignore[arg-type]
    with pytest.raises(StoreUnavailable) as err:
        store.ping()
    assert str(err.value) == (
        "Redis at redis://***@127.0.0.1:6390/0 is version 6.2.14: Kompaktor needs Redis >= 7.0 "
        "(its code runs as Redis functions)"
    )
