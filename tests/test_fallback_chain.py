"""The `fallback=` option's steps: every surface checks them here, so a misspelt step is one error."""

from __future__ import annotations

import pytest

from rag_rerank import InputError, make_backend
from rag_rerank.backends.input_order import InputOrderBackend
from rag_rerank.fallback_chain import STEP_NAMES, as_chain, build_step, step_name


def test_none_and_a_single_name() -> None:
    assert as_chain(None) == ()
    assert as_chain("local") == ("local",)
    assert as_chain(["cross-encoder:/models/ce", "local", "input"]) == ("cross-encoder:/models/ce", "local",
                                                                         "input")
    assert step_name("cross-encoder:/models/ce") == "cross-encoder"


def test_a_backend_instance_is_a_step_named_by_its_name() -> None:
    backend = make_backend("local")
    assert as_chain([backend, "input"]) == (backend, "input")
    assert step_name(backend) == "local" and step_name("input") == "input"
    assert build_step(backend, "lexical") is backend


def test_the_cross_encoder_step_names_its_model_and_other_steps_take_none() -> None:
    with pytest.raises(InputError) as err:
        as_chain(["cross-encoder", "local:x", "input:y"])
    messages = [v.message for v in err.value.violations]
    assert messages[0].startswith("the cross-encoder step needs its model: 'cross-encoder:MODEL'")
    assert messages[1].startswith("unknown fallback step 'local:x'")
    assert messages[2].startswith("unknown fallback step 'input:y'")


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(InputError) as err:
        as_chain(["input", "lcoal", "local", "local", 3])
    paths = [(v.path, v.message) for v in err.value.violations]
    text = str(err.value)
    assert "fallback[0]" in text and "put it last" in text
    assert "unknown fallback step 'lcoal'; did you mean 'local'?" in text
    assert ("fallback[3]", "fallback step 'local' is listed twice") in paths
    assert any(p == "fallback[4]" and "got int" in m for p, m in paths)


@pytest.mark.parametrize("value", [[], {}, 1.5, ("",)])
def test_not_a_chain(value: object) -> None:
    with pytest.raises(InputError) as err:
        as_chain(value)
    assert err.value.violations[0].path.startswith("fallback")


def test_built_steps() -> None:
    assert isinstance(build_step("input", "lexical"), InputOrderBackend)
    assert build_step("local", "lexical").name == "local"
    assert set(STEP_NAMES) == {"local", "cross-encoder", "input"}
