"""The metadata store's parts (kompaktor.metadata.store): one MetadataStore made of modules by
concern. No server: what is checked is the composition — every operation defined once, in the
part named for its concern, every part's scripts registered (and loaded by load_scripts), a
fenced view of the same make."""

from __future__ import annotations

import inspect
from typing import Any

from kompaktor.metadata import store as store_pkg
from kompaktor.metadata.store import MetadataStore, Mutation, StoreBase, TabletChange
from kompaktor.metadata.store.mutation import Mutation as MutationDef

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
    """Records the scripts registered; Redis itself is never called."""

    def __init__(self) -> None:
        self.registered: list[str] = []

    def register_script(self, source: str) -> Any:
        self.registered.append(source)
        return type("Script", (), {"sha": f"sha{len(self.registered)}", "script": source})()

    def script_exists(self, *shas: str) -> list[bool]:
        return [sha != "sha1" for sha in shas]

    def script_load(self, source: str) -> None:
        self.loaded = source


def test_every_parts_scripts_are_registered_and_loaded() -> None:
    client = _Client()
    store = MetadataStore(client)  # type: ignore[arg-type]
    names = ("_mutate", "_reserve", "_fenced_write", "_lease_acquire", "_lease_renew", "_lease_release", "_failures")
    for name in names:
        assert getattr(store, name).script in client.registered
    assert len(client.registered) == len(names)
    assert store.load_scripts() == 1  # the one Redis does not hold (sha1), queues' scripts included
    assert len(client.registered) == len(names) + len(store.queues.scripts())


def test_a_fenced_view_is_a_whole_store_on_the_same_connection() -> None:
    client = _Client()
    store = MetadataStore(client, "redis://127.0.0.1:6390/0")  # type: ignore[arg-type]
    view = store.fenced(lambda: 7)
    assert type(view) is MetadataStore and view._r is client and view.url == store.url
    assert view._token() == "7" and store._token() == ""
