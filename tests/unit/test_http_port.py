"""The compactor's HTTP port is spelled in three places that cannot import one another cheaply:
``kompaktor.worker.http.DEFAULT_PORT`` (the endpoints), the CLI's option defaults (which import
the worker only when a command runs, to keep ``kompaktor --help`` fast) and the operator's
``naming.HTTP_PORT`` (the pods' port; the operator may not import ``kompaktor.worker``). They agree."""

from __future__ import annotations

import click

from kompaktor.cli.compactor import compactor, drain
from kompaktor.worker.http import DEFAULT_PORT
from kompaktor_operator import naming


def _default(command: click.Command, name: str) -> object:
    (param,) = [p for p in command.params if p.name == name]
    return param.default


def test_the_compactors_http_port_is_one_number() -> None:
    assert _default(compactor, "http_port") == DEFAULT_PORT
    assert _default(drain, "port") == DEFAULT_PORT
    assert naming.HTTP_PORT == DEFAULT_PORT
