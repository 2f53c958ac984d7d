"""Fixtures of the model tests: the tiny offline model (built once per module), and a copy with large random
weights whose sampled outputs vary (`tinymodel.noisy_copy`)."""

from __future__ import annotations

import pytest
import tinymodel
from tinymodel import noisy_copy

from trace_cli.models.refs import resolve_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return tinymodel.tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def noisy_ref(tiny_model, tmp_path_factory):
    return resolve_model(str(noisy_copy(tiny_model, tmp_path_factory.mktemp("noisy") / "hf")))
