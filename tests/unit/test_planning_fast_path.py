"""The planning pass' fast path (``policy.planning.TabletPlanner.doc``): a plain tablet is planned
from its stored document without building the model objects. It must give exactly what the full
path (``Tablet.from_json`` then ``plan_tablet``) gives, and never skip a tablet the full path would
plan: hypothesis generates tablet documents (plain or not), tables (ratio, file limit, selector,
dispatch, state) and services (size tiers), and compares the two."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from kompaktor.model.tablet import OFFLINE, ONLINE, TableInfo, Tablet
from kompaktor.policy.planning import TabletPlanner, plan_tablet
from kompaktor.policy.services import ServiceConfig, Tier
from kompaktor.policy.tableprops import DISPATCH_PREFIX, FILE_MAX, RATIO, SELECTOR

NOW = 1_000_000
SERVICES = {
    "default": ServiceConfig("default"),
    "tiered": ServiceConfig(
        "tiered",
        tiers=(Tier("small", 50, "g-small"), Tier("medium", 200, "g-medium"), Tier("large", 400, "g-large")),
        ratio=2.0,
        max_open=4,
        max_files_per_tablet=5,
        tables=("b*",),  # tables named b...: by pattern; others by a dispatch property
    ),
}

names = st.sampled_from([f"F{i:02d}.parquet" for i in range(14)])
sizes = st.one_of(st.integers(0, 3), st.integers(1, 120), st.sampled_from([10, 20, 40, 100]))


@st.composite
def file_meta(draw: st.DrawFn) -> dict:
    m = {"size": draw(sizes), "entries": draw(st.integers(0, 100)), "deletes": draw(st.integers(0, 100))}
    if draw(st.booleans()):
        m["first"], m["last"] = "61", "7a"
    return m


@st.composite
def tablet_docs(draw: st.DrawFn) -> dict:
    files = draw(st.dictionaries(names, file_meta(), max_size=12))
    d: dict = {"table": "t1", "prev": None, "end": "6d", "files": files, "v": draw(st.integers(0, 9))}
    plain = draw(st.booleans())  # about half plain: the fast path's case
    if draw(st.booleans()):
        d["running"] = {}
    if not plain and files:
        fs = sorted(files)
        if draw(st.booleans()):
            picked = draw(st.lists(st.sampled_from(fs), min_size=1, max_size=4, unique=True))
            d["running"] = {
                "E1": {
                    "kind": draw(st.sampled_from(["SYSTEM", "USER", "SELECTOR"])),
                    "files": picked,
                    "group": "default",
                    "priority": 1,
                    "compactor": "c1",
                    "started": 1,
                    "output": "tables/t1/out.parquet",
                }
            }
        if draw(st.booleans()):
            chosen = draw(st.lists(st.sampled_from(fs), min_size=1, max_size=6, unique=True))
            d["sel"] = {
                "id": draw(st.sampled_from(["U1", "U2", "SEL-1"])),
                "kind": draw(st.sampled_from(["USER", "SELECTOR"])),
                "files": chosen,
                "done": draw(st.integers(0, 1)),
                "created": draw(st.sampled_from([0, NOW - 10, NOW])),
            }
    if draw(st.booleans()):
        d["sel"] = draw(st.sampled_from([None, {}]))  # no selection, written either way
    if draw(st.integers(0, 5)) == 0:
        d["op"] = "split"
    if draw(st.integers(0, 3)) == 0:
        d["hold"] = "U1"
    return d


@st.composite
def tables(draw: st.DrawFn) -> TableInfo:
    props: dict[str, str] = {}
    if draw(st.booleans()):
        props[RATIO] = draw(st.sampled_from(["1.5", "2", "3", "4.5"]))
    if draw(st.booleans()):
        props[FILE_MAX] = draw(st.sampled_from(["0", "1", "2", "3", "6", "20"]))
    if draw(st.booleans()):
        props[SELECTOR] = "too-many-deletes"
    service = draw(st.sampled_from([None, "tiered", "missing", "default"]))
    if service is not None:
        props[draw(st.sampled_from([DISPATCH_PREFIX, f"{DISPATCH_PREFIX}.system"]))] = service
    state = draw(st.sampled_from([ONLINE, ONLINE, ONLINE, OFFLINE]))
    return TableInfo("t1", draw(st.sampled_from(["alpha", "beta"])), state, props)


@settings(max_examples=1500, deadline=None)
@given(tablet_docs(), tables(), st.sampled_from([(), ("U1",)]), st.booleans())
def test_the_fast_path_plans_what_the_full_path_plans(d: dict, table: TableInfo, active, skipping: bool) -> None:
    doc = orjson.loads(orjson.dumps(d))  # as the pass decodes it
    full = plan_tablet(Tablet.from_json("t1;6d", doc), table, SERVICES, NOW, active)
    skip = {"x"}
    if skipping and full.jobs:  # a fingerprint to skip: the first job's
        from kompaktor.model.job import fingerprint

        skip = {fingerprint("t1;6d", full.jobs[0].files)}
        full = plan_tablet(Tablet.from_json("t1;6d", doc), table, SERVICES, NOW, active, skip)
    planner = TabletPlanner(SERVICES, NOW, active, skip)
    fast = planner.doc("t1;6d", doc, table)
    plain = not (doc.get("op") or doc.get("running") or doc.get("sel"))
    selector_runs = doc.get("hold") is None and table.props.get(SELECTOR) == "too-many-deletes"
    if plain and not selector_runs:
        assert fast is not None  # the case the fast path exists for is taken
    if fast is not None:
        assert fast == full
        assert fast.select is None
    # the same planner object (its per-table cache) gives the full path's answer too
    assert planner.tablet(Tablet.from_json("t1;6d", doc), table) == full


def test_a_pass_planner_routes_each_table_by_its_own_properties() -> None:
    """The per-table cache of a pass keys on the table object: two tables, two services."""
    planner = TabletPlanner(SERVICES, NOW)
    files = {f"F{i}": {"size": s, "entries": 1} for i, s in enumerate([10, 10, 10, 10])}
    a = TableInfo("a", "alpha", ONLINE, {})
    b = TableInfo("b", "beta", ONLINE, {})
    c = TableInfo("c", "alpha", ONLINE, {DISPATCH_PREFIX: "tiered"})
    for table, group in ((a, "default"), (b, "g-small"), (a, "default"), (c, "g-small"), (b, "g-small")):
        tp = planner.doc(f"{table.id};~", {"table": table.id, "files": files}, table)
        assert tp is not None and [j.group for j in tp.jobs] == [group]


def test_small_tablets_exhaustively() -> None:
    """Tablets of 0 to 3 files (a tablet just compacted has one): every size pattern against ratio
    and file-limit properties at their edges, fast path against full path; the ones that plan a
    job show the cases are not all empty."""
    from itertools import product

    planned = 0
    for n in range(4):
        for pattern in product([0, 1, 10, 14, 20], repeat=n):
            files = {f"F{i}": {"size": s, "entries": 5} for i, s in enumerate(pattern)}
            for ratio, file_max in product([None, "1", "1.5", "3"], [None, "0", "1", "2", "3"]):
                props = {k: v for k, v in ((RATIO, ratio), (FILE_MAX, file_max)) if v is not None}
                table = TableInfo("t1", "alpha", ONLINE, props)
                doc = {"table": "t1", "files": files}
                full = plan_tablet(Tablet.from_json("t1;~", doc), table, SERVICES, NOW)
                fast = TabletPlanner(SERVICES, NOW).doc("t1;~", doc, table)
                assert fast == full, (pattern, ratio, file_max)
                planned += bool(full.jobs)
    assert planned > 100
