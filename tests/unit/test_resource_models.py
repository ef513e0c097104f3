"""The CRD models: defaults, validation a person can act on, conversion to the core's configs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kompaktor.resources import models as m


def test_service_defaults_match_the_planner_defaults() -> None:
    spec = m.CompactionServiceSpec()
    assert (spec.ratio, spec.max_open, spec.max_files_per_tablet, spec.lowest_ratio) == (3.0, 10, 15, 1.1)
    assert [(t.name, t.max_size, t.compactor_group) for t in spec.tiers] == [("default", None, "default")]
    assert spec.tables == ["*"] and spec.kinds == ["SYSTEM", "USER", "SELECTOR"]


def test_camel_case_on_the_wire_and_frozen() -> None:
    spec = m.CompactionServiceSpec.model_validate(
        {
            "maxOpen": 5,
            "tiers": [
                {"name": "small", "maxSize": "32Mi", "compactorGroup": "small"},
                {"name": "large", "compactorGroup": "large"},
            ],
        }
    )
    assert spec.max_open == 5
    assert spec.to_wire()["tiers"][0] == {"name": "small", "maxSize": "32Mi", "compactorGroup": "small"}
    with pytest.raises(ValidationError):
        spec.max_open = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"ratio": 0.5}, "ratio"),
        ({"maxOpen": 1}, "maxOpen"),
        ({"unknown": 1}, "Extra inputs"),
        ({"tiers": []}, "tiers"),
        (
            {"tiers": [{"name": "a", "compactorGroup": "a"}, {"name": "b", "maxSize": "1Gi", "compactorGroup": "b"}]},
            "only the last tier may be unbounded",
        ),
        (
            {
                "tiers": [
                    {"name": "a", "maxSize": "1Gi", "compactorGroup": "a"},
                    {"name": "b", "maxSize": "1G", "compactorGroup": "b"},
                ]
            },
            "larger than the previous",
        ),
        (
            {"tiers": [{"name": "a", "maxSize": "1Gi", "compactorGroup": "a"}, {"name": "a", "compactorGroup": "b"}]},
            "repeated: a",
        ),
        ({"tiers": [{"name": "a", "maxSize": "lots", "compactorGroup": "a"}]}, "not a Kubernetes quantity"),
        ({"tiers": [{"name": "a", "maxSize": 0, "compactorGroup": "a"}]}, "greater than zero"),
        ({"tiers": [{"name": "a", "compactorGroup": "Not_A_Name"}]}, "DNS label"),
        ({"kinds": ["SYSTEM", "SYSTEM"]}, "twice"),
        ({"kinds": ["MINOR"]}, "kinds"),
    ],
)
def test_service_validation_says_what_is_wrong(spec: dict, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        m.CompactionServiceSpec.model_validate(spec)
    text = m.explain(err.value) + str(err.value)
    assert words in text


def test_quantity_keeps_its_kubernetes_meaning() -> None:
    pytest.importorskip("kompaktor.policy.sizes")
    spec = m.CompactionServiceSpec.model_validate(
        {
            "tiers": [
                {"name": "s", "maxSize": "32M", "compactorGroup": "s"},
                {"name": "m", "maxSize": "32Mi", "compactorGroup": "m"},
                {"name": "l", "maxSize": 2**40, "compactorGroup": "l"},
            ]
        }
    )
    assert [t.max_size_bytes() for t in spec.tiers] == [32_000_000, 33_554_432, 2**40]


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"minReplicas": 5, "maxReplicas": 2}, "larger than maxReplicas"),
        ({"autoscaler": "cpu"}, "autoscaler"),
        ({"jobsPerReplica": 0}, "jobsPerReplica"),
        ({"podAnnotations": {"kopf.zalando.org/last-handled-configuration": "x"}}, "reserved"),
        ({"spark": {"driverMemory": "2 gigs"}}, "driverMemory"),
        ({"resources": {"requests": {"cpu": "two"}}}, "quantity"),
    ],
)
def test_group_validation_says_what_is_wrong(spec: dict, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        m.CompactorGroupSpec.model_validate(spec)
    assert words in m.explain(err.value) + str(err.value)


def test_an_hpa_group_may_have_zero_replicas_and_its_hpa_keeps_a_floor_of_one() -> None:
    from kompaktor_operator import manifests

    hpa = m.CompactorGroupSpec.model_validate({"minReplicas": 0, "maxReplicas": 4})
    assert hpa.autoscaler == "hpa" and hpa.desired_replicas() == 0  # parked until the first job
    rendered = manifests.build_hpa("g", hpa)
    assert rendered["spec"]["minReplicas"] == 1  # the operator, not the HPA, goes to and from 0


def test_keda_and_none_allow_zero_and_desired_is_clamped() -> None:
    keda = m.CompactorGroupSpec.model_validate({"autoscaler": "keda", "minReplicas": 0, "maxReplicas": 4})
    assert keda.desired_replicas() == 0
    assert keda.model_copy(update={"replicas": 9}).desired_replicas() == 4
    fixed = m.CompactorGroupSpec.model_validate({"autoscaler": "none", "minReplicas": 2, "replicas": 1})
    assert fixed.desired_replicas() == 2


def test_compaction_spec_range_and_iterators() -> None:
    spec = m.CompactionSpec.model_validate(
        {
            "table": "ci",
            "startRow": "a",
            "endRow": "m",
            "iterators": {"ageOff": {"ttlSeconds": 60}, "rowFilter": {"regex": "^tmp_"}},
        }
    )
    assert spec.row_bytes() == (b"a", b"m")
    assert spec.iterator_config() == {"ageoff_ttl_ms": 60_000, "row_regex": "^tmp_"}
    assert m.CompactionSpec(table="t").iterator_config() == {}
    with pytest.raises(ValidationError, match="must sort before"):
        m.CompactionSpec.model_validate({"table": "ci", "startRow": "m", "endRow": "a"})
    with pytest.raises(ValidationError, match="does not compile"):
        m.CompactionSpec.model_validate({"table": "ci", "iterators": {"rowFilter": {"regex": "("}}})


def test_phase_terminal() -> None:
    assert m.CompactionPhase.SUCCEEDED.terminal and not m.CompactionPhase.RUNNING.terminal


DOCS = """
apiVersion: kompaktor.io/v1alpha1
kind: CompactionService
metadata: {name: cs1}
spec:
  tiers:
  - {name: small, maxSize: 32Mi, compactorGroup: small}
  - {name: large, compactorGroup: large}
---
apiVersion: kompaktor.io/v1alpha1
kind: CompactorGroup
metadata: {name: small}
spec: {minReplicas: 1, maxReplicas: 4, jobsPerReplica: 2, drainGraceSeconds: 30}
---
---
apiVersion: kompaktor.io/v1alpha1
kind: Compaction
metadata: {name: c1}
spec: {table: ci}
"""


def test_load_documents() -> None:
    docs = m.load_documents(DOCS)
    assert [type(d).__name__ for d in docs] == ["CompactionService", "CompactorGroup", "Compaction"]
    assert docs[0].name == "cs1" and docs[1].spec.jobs_per_replica == 2


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n", "apiVersion must be kompaktor.io/v1alpha1"),
        ("apiVersion: kompaktor.io/v1alpha1\nkind: Table\nmetadata: {name: x}\n", "kind 'Table'"),
        (
            "apiVersion: kompaktor.io/v1alpha1\nkind: CompactorGroup\nmetadata: {name: g}\nspec: {maxReplicas: 0}\n",
            "document 1 (CompactorGroup g): spec.maxReplicas",
        ),
        ("apiVersion: kompaktor.io/v1alpha1\nkind: CompactorGroup\nmetadata: {name: Big_Name}\n", "metadata.name"),
        ("- a\n- b\n", "expected a mapping"),
        ("a: [\n", "not valid YAML"),
    ],
)
def test_load_documents_errors(text: str, words: str) -> None:
    with pytest.raises(m.DocumentError) as err:
        m.load_documents(text)
    assert words in str(err.value)


@pytest.mark.parametrize("name", ["grüppe", "ｓmall", "small\n", "Small", "a_b", "-a", "a-", "a" * 41, ""])
def test_a_group_name_is_an_ascii_dns_label_everywhere(name: str) -> None:
    """One check of a group's name (the models, local configuration, the operator's handler):
    letters outside ASCII are refused, as DNS-1123 and the names of Deployments require."""
    with pytest.raises(ValueError, match="DNS label"):
        m.check_group_name(name)
    with pytest.raises(ValidationError):
        m.CompactorGroup.model_validate({"metadata": {"name": name}})
    with pytest.raises(ValidationError):
        m.CompactionServiceSpec.model_validate({"tiers": [{"name": "t", "compactorGroup": name}]})


def test_a_valid_group_name_passes() -> None:
    for name in ("small", "a", "g-1", "0", "a" * 40):
        assert m.check_group_name(name) == name
        assert m.CompactorGroup.model_validate({"metadata": {"name": name}}).name == name


def test_conversion_to_core_configs() -> None:
    services = pytest.importorskip("kompaktor.policy.services")
    svc, group = m.load_documents(DOCS)[:2]
    cfg = m.to_service_config(svc.name, svc.spec)
    assert isinstance(cfg, services.ServiceConfig)
    assert cfg.tiers == (services.Tier("small", 33_554_432, "small"), services.Tier("large", None, "large"))
    assert (cfg.ratio, cfg.max_open, cfg.tables, cfg.kinds) == (3.0, 10, ("*",), ("SYSTEM", "USER", "SELECTOR"))
    gcfg = m.to_group_config(group.name, group.spec)
    assert isinstance(gcfg, services.GroupConfig)
    assert (gcfg.name, gcfg.min_replicas, gcfg.max_replicas, gcfg.jobs_per_replica, gcfg.drain_grace_seconds) == (
        "small",
        1,
        4,
        2,
        30,
    )
    assert gcfg.spark_master == "local[*]" and dict(gcfg.spark_conf) == {}
    services_, groups = m.configs(m.load_documents(DOCS))
    assert [s.name for s in services_] == ["cs1"] and [g.name for g in groups] == ["small"]


def test_executor_settings_reach_the_group_config() -> None:
    """Issue 17 §2: a CompactorGroup's executor memory/cores become Spark conf for the session,
    through the GroupConfig the compactor reads from Redis (its one channel, issue 26 §1)."""
    from kompaktor.worker.compactor import WorkerSettings

    spec = m.CompactorGroupSpec.model_validate(
        {
            "spark": {
                "master": "spark://spark-master:7077",
                "executorMemory": "6g",
                "executorCores": 2,
                "conf": {"spark.cores.max": "8"},
                "driverMemory": "1g",
            }
        }
    )
    gcfg = m.to_group_config("big", spec)
    assert gcfg.spark_master == "spark://spark-master:7077" and gcfg.driver_memory == "1g"
    assert dict(gcfg.spark_conf) == {"spark.cores.max": "8", "spark.executor.memory": "6g", "spark.executor.cores": "2"}
    worker = WorkerSettings.for_group(gcfg, "c")
    assert (worker.group, worker.spark_master, worker.driver_memory) == ("big", "spark://spark-master:7077", "1g")
    assert worker.spark_conf == dict(gcfg.spark_conf)


@pytest.mark.parametrize(
    "spark",
    [
        {"executorMemory": "2g", "conf": {"spark.executor.memory": "4g"}},
        {"conf": {"spark.master": "local[2]"}},
        {"executorMemory": "lots"},
        {"executorCores": 0},
    ],
)
def test_conflicting_or_invalid_executor_settings_are_refused(spark: dict) -> None:
    with pytest.raises(ValueError):
        m.CompactorGroupSpec.model_validate({"spark": spark})


def test_a_groups_defaults_are_the_same_everywhere() -> None:
    """Issue 26 §1: drain grace was 300 s in the CRD and 60 s in GroupConfig and the compactor;
    maxReplicas 10 against 4; jobsPerReplica 1 against 2. One home now (policy.services)."""
    import dataclasses

    from kompaktor.policy import services as d
    from kompaktor.resources import models as m
    from kompaktor.worker.compactor import WorkerSettings

    spec = m.CompactorGroupSpec()
    cfg = d.GroupConfig("g")
    worker = WorkerSettings("g", "c")
    assert (spec.min_replicas, cfg.min_replicas) == (d.DEFAULT_MIN_REPLICAS,) * 2
    assert (spec.max_replicas, cfg.max_replicas) == (d.DEFAULT_MAX_REPLICAS,) * 2
    assert (spec.jobs_per_replica, cfg.jobs_per_replica) == (d.DEFAULT_JOBS_PER_REPLICA,) * 2
    assert (spec.drain_grace_seconds, cfg.drain_grace_seconds, worker.drain_grace_s) == (d.DEFAULT_DRAIN_GRACE_S,) * 3
    assert (spec.spark.master, cfg.spark_master, worker.spark_master) == (d.DEFAULT_SPARK_MASTER,) * 3
    assert (spec.spark.engine, cfg.engine, worker.engine) == (d.DEFAULT_ENGINE,) * 3
    assert (spec.resume.enabled, cfg.resume, worker.resume) == (d.DEFAULT_RESUME,) * 3
    assert (spec.resume.min_input_bytes(), cfg.resume_min_bytes, worker.resume_min_bytes) == (
        d.DEFAULT_RESUME_MIN_BYTES,
    ) * 3
    # the engines hold no default of their own: they run with what the compactor resolved
    from kompaktor.engines import make_engine

    assert make_engine("arrow", resume_min_bytes=7).resume_min_bytes == 7
    assert make_engine("arrow").resume_min_bytes is None  # told nothing: never resumable
    # and what the operator stores for a group that leaves everything out is exactly that
    assert dataclasses.asdict(m.to_group_config("g", spec)) == dataclasses.asdict(cfg)


def test_the_engine_names_are_listed_once() -> None:
    """Issue 26 §1: the CRD's enum, the engines' factory, and the --engine choices of
    `kompaktor compactor` and `kompaktor merge` are one tuple (model.engines.ENGINES)."""
    import click

    from kompaktor import engines
    from kompaktor.cli.compactor import compactor
    from kompaktor.cli.merge import merge
    from kompaktor.model.engines import ENGINES
    from kompaktor.policy import services as d

    schema = m.SparkSettings.model_json_schema()["properties"]["engine"]
    assert tuple(schema["enum"]) == ENGINES and d.ENGINES is engines.ENGINES is ENGINES
    for command in (compactor, merge):
        (option,) = [p for p in command.params if p.name == "engine"]
        assert isinstance(option.type, click.Choice) and tuple(option.type.choices) == ENGINES


@pytest.mark.parametrize(
    "kw, words",
    [({"engine": "flink"}, "engine 'flink' is not one of spark, arrow"), ({"drain_grace_seconds": -1}, ">= 0")],
)
def test_a_group_config_refuses_what_no_compactor_could_run(kw: dict, words: str) -> None:
    from kompaktor.policy.services import GroupConfig

    with pytest.raises(ValueError, match=words):
        GroupConfig("g", **kw)


def test_a_group_config_is_the_compactors_settings() -> None:
    """What the operator stores for a CompactorGroup is what `kompaktor compactor` runs with
    (WorkerSettings.for_group), and its settings digest moves with each of those settings only."""
    from kompaktor.worker.compactor import WorkerSettings

    spec = m.CompactorGroupSpec.model_validate(
        {
            "spark": {"engine": "arrow", "master": "local[3]", "conf": {"spark.a": "b"}, "driverMemory": "3g"},
            "drainGraceSeconds": 45,
            "maxReplicas": 5,
            "resume": {"minInputSize": "2Gi"},
            "history": {"maxRecords": 500, "maxAgeSeconds": 3600},
        }
    )
    cfg = m.to_group_config("g", spec)
    w = WorkerSettings.for_group(cfg, "c-1")
    assert (w.history_limits.max_records, w.history_limits.max_age_s) == (500, 3600.0)
    assert (
        w.group,
        w.compactor_id,
        w.engine,
        w.spark_master,
        w.spark_conf,
        w.driver_memory,
        w.drain_grace_s,
        w.resume,
        w.resume_min_bytes,
    ) == ("g", "c-1", "arrow", "local[3]", {"spark.a": "b"}, "3g", 45.0, True, 2 << 30)
    assert w.describe() == (
        "engine=arrow spark_master=local[3] spark_conf=spark.a=b driver_memory=3g drain_grace=45s resume=2Gi "
        "history=500/3600s"
    )
    import dataclasses

    assert dataclasses.replace(cfg, max_replicas=9).settings_digest() == cfg.settings_digest()
    assert dataclasses.replace(cfg, drain_grace_seconds=46).settings_digest() != cfg.settings_digest()
    assert dataclasses.replace(cfg, resume=False).settings_digest() != cfg.settings_digest()
    assert dataclasses.replace(cfg, resume_min_bytes=1).settings_digest() != cfg.settings_digest()
    assert dataclasses.replace(cfg, history_records=501).settings_digest() != cfg.settings_digest()
    assert dataclasses.replace(cfg, history_age_seconds=3601).settings_digest() != cfg.settings_digest()
    off = WorkerSettings.for_group(dataclasses.replace(cfg, resume=False), "c-1")
    assert off.describe().endswith(" drain_grace=45s resume=off history=500/3600s")


@pytest.mark.parametrize(
    ("resume", "enabled", "min_bytes"),
    [
        ({}, True, 1 << 30),
        ({"enabled": False}, False, 1 << 30),
        ({"minInputSize": "512Mi"}, True, 512 << 20),
        ({"minInputSize": "50G"}, True, 50_000_000_000),
        ({"minInputSize": 0}, True, 0),
        ({"minInputSize": 4096}, True, 4096),
    ],
)
def test_a_groups_resume_settings_reach_its_group_config(resume: dict, enabled: bool, min_bytes: int) -> None:
    cfg = m.to_group_config("g", m.CompactorGroupSpec.model_validate({"resume": resume}))
    assert (cfg.resume, cfg.resume_min_bytes) == (enabled, min_bytes)
    # what the operator stores is what a compactor reads back
    from kompaktor.policy.services import GroupConfig

    assert GroupConfig.from_json(cfg.to_json()) == cfg


def test_a_group_config_stored_before_resume_settings_existed_reads_with_the_defaults() -> None:
    """An older operator stored groups without them: a compactor reads those with the defaults."""
    import json

    from kompaktor.policy import services as d

    stored = json.loads(d.GroupConfig("g").to_json())
    del stored["resume"], stored["resume_min_bytes"]
    cfg = d.GroupConfig.from_json(json.dumps(stored))
    assert (cfg.resume, cfg.resume_min_bytes) == (d.DEFAULT_RESUME, d.DEFAULT_RESUME_MIN_BYTES)


@pytest.mark.parametrize(
    ("resume", "words"),
    [
        ({"minInputSize": "-1Gi"}, "resume.minInputSize: '-1Gi' is negative"),
        ({"minInputSize": -5}, "resume.minInputSize: -5 is negative"),
        ({"minInputSize": "1Gb"}, "resume.minInputSize: '1Gb' is not a Kubernetes quantity"),
        ({"minInputSize": "lots"}, "resume.minInputSize: 'lots' is not a Kubernetes quantity"),
        ({"minInputSize": True}, "resume.minInputSize: a quantity is an integer or a string"),
        ({"minInputSize": "1e400"}, "resume.minInputSize: '1e400' is more than 2^63 - 1 bytes"),
        ({"enabled": "sometimes"}, "resume.enabled"),
        ({"minBytes": 1}, "resume.minBytes: Extra inputs are not permitted"),
    ],
)
def test_bad_resume_settings_are_refused_with_a_clear_error(resume: dict, words: str) -> None:
    with pytest.raises(ValidationError) as err:
        m.CompactorGroupSpec.model_validate({"resume": resume})
    assert words in m.explain(err.value)


@pytest.mark.parametrize(("value", "valid"), [("1Gi", True), ("0", True), (5, True), ("-1Gi", False), ("+1Gi", False)])
def test_the_crd_refuses_a_signed_resume_size(value: int | str, valid: bool) -> None:
    """The API server refuses a signed size string before the operator sees it (the pattern; a
    negative integer is the model's to refuse, above)."""
    import jsonschema

    from kompaktor.resources import crdgen

    schema = crdgen.structural(m.ResumeSettings.model_json_schema())["properties"]["minInputSize"]
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(value))
    assert (not errors) == valid, errors


@pytest.mark.parametrize(
    ("spec", "records", "age"),
    [
        ({}, 10_000, 604_800),
        ({"maxRecords": 1}, 1, 604_800),
        ({"maxRecords": 1_000_000, "maxAgeSeconds": 31_622_400}, 1_000_000, 31_622_400),
        ({"maxAgeSeconds": 60}, 10_000, 60),
    ],
)
def test_a_groups_history_bounds_reach_its_group_config(spec: dict, records: int, age: int) -> None:
    """spec.history, the defaults unchanged when left out; what the operator stores is what a
    compactor reads back."""
    from kompaktor.policy.services import GroupConfig

    cfg = m.to_group_config("g", m.CompactorGroupSpec.model_validate({"history": spec}))
    assert (cfg.history_records, cfg.history_age_seconds) == (records, age)
    assert GroupConfig.from_json(cfg.to_json()) == cfg


def test_a_group_config_stored_before_history_bounds_existed_reads_with_the_defaults() -> None:
    import json

    from kompaktor.policy import services as d

    stored = json.loads(d.GroupConfig("g").to_json())
    del stored["history_records"], stored["history_age_seconds"]
    cfg = d.GroupConfig.from_json(json.dumps(stored))
    assert (cfg.history_records, cfg.history_age_seconds) == (10_000, 7 * 86_400)


@pytest.mark.parametrize(
    ("history", "words"),
    [
        ({"maxRecords": 0}, "history.maxRecords: Input should be greater than or equal to 1"),
        ({"maxRecords": -3}, "history.maxRecords: Input should be greater than or equal to 1"),
        ({"maxRecords": 1_000_001}, "history.maxRecords: Input should be less than or equal to 1000000"),
        ({"maxAgeSeconds": 0}, "history.maxAgeSeconds: Input should be greater than or equal to 1"),
        ({"maxAgeSeconds": 40_000_000}, "history.maxAgeSeconds: Input should be less than or equal to 31622400"),
        ({"maxRecords": "lots"}, "history.maxRecords: Input should be a valid integer"),
        ({"maxRecords": True}, "history.maxRecords: Input should be a valid integer"),
        ({"maxAgeSeconds": 1.5}, "history.maxAgeSeconds: Input should be a valid integer"),
        ({"maxAge": "7d"}, "history.maxAge: Extra inputs are not permitted"),
    ],
)
def test_bad_history_bounds_are_refused_in_one_line(history: dict, words: str) -> None:
    from kompaktor.policy.services import GroupConfig

    with pytest.raises(ValidationError) as err:
        m.CompactorGroupSpec.model_validate({"history": history})
    text = m.explain(err.value)
    assert words in text and "\n" not in text, text
    with pytest.raises(ValueError, match="history"):  # nor can a GroupConfig hold them
        GroupConfig("g", history_records=0)


@pytest.mark.parametrize(
    ("value", "valid"), [({"maxRecords": 1}, True), ({"maxRecords": 0}, False), ({"maxAgeSeconds": 10**9}, False)]
)
def test_the_crd_refuses_history_bounds_out_of_range(value: dict, valid: bool) -> None:
    """The API server refuses them at admission, before the operator sees them (the schema's
    minimum and maximum)."""
    import jsonschema

    from kompaktor.resources import crdgen

    schema = crdgen.openapi_schema(m.CompactorGroup)["properties"]["spec"]["properties"]["history"]
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(value))
    assert (not errors) == valid, errors


def test_a_stored_group_config_with_settings_a_newer_operator_added_still_reads() -> None:
    """A rolling upgrade: the new operator stores a key this compactor does not know; the
    compactor still starts with every setting it knows."""
    import json

    from kompaktor.policy.services import GroupConfig

    cfg = GroupConfig("large", max_replicas=7, engine="arrow")
    doc = json.loads(cfg.to_json()) | {"a_setting_from_the_future": {"x": 1}}
    assert GroupConfig.from_json(json.dumps(doc)) == cfg
