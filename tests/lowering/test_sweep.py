"""The lowering sweep over onnx's node cases (engine/conformance/lowered.py): each case whose gradient the
engine computes, lowered by engine.lower, checked, run by onnxruntime and compared with the engine.

The full sweep (`onnxgrad conformance --lower`, minutes) is recorded in tests/lowering_floor.json by
`python scripts/gen_ops_doc.py --lower`; CI re-runs one case per op (seeded) and holds it to the record.
"""
from __future__ import annotations

import json

import pytest

from engine.conformance import case_named
from engine.conformance.lowered import ERROR, LOWERED, NOT_APPLICABLE, REFUSED, WRONG, lower_case
from engine.conformance.suite import lowering_sample
from tests import paths

pytest.importorskip("onnxruntime")
ROOT = paths.ROOT
RECORD = json.loads((ROOT / "tests" / "lowering_floor.json").read_text())
CONFORMANCE = json.loads((ROOT / "tests" / "conformance_floor.json").read_text())


@pytest.fixture(scope="module")
def sample():
    return lowering_sample(CONFORMANCE["passing"])


@pytest.mark.slow
def test_sampled_cases_still_lower(sample):
    recorded = set(RECORD["lowered"])
    reasons = {o.name: f"{o.status}: {o.reason}" for o in sample}
    lost = sorted(o.name for o in sample if o.name in recorded and o.status != LOWERED)
    assert not lost, "cases that lowered before fail now:\n" + "\n".join(f"{n}: {reasons[n]}" for n in lost)
    assert sum(o.status == LOWERED for o in sample) >= 100  # one case per op: most ops lower


@pytest.mark.slow
def test_sample_has_no_wrong_gradient_and_one_line_refusals(sample):
    bad = [o for o in sample if o.status in (WRONG, ERROR) and not o.documented]
    assert not bad, "\n".join(f"{o.name}: {o.reason}" for o in bad)
    refusals = [o.reason for o in sample if o.status == REFUSED]
    assert all(r and "\n" not in r for r in refusals), refusals


def test_record_meets_the_target():
    """The recorded full sweep: at least 95% of every case whose gradient the engine computes lowers and
    matches in onnxruntime (those it cannot run included), none is wrong or documented as wrong."""
    summary = dict(RECORD["summary"])
    assert summary.get(LOWERED, 0) >= 0.95 * summary["applicable"]
    assert RECORD["wrong_or_error_max"] == 0
    assert summary.get(WRONG, 0) == summary.get("documented", 0) == 0
    assert len(RECORD["lowered"]) == summary.get(LOWERED, 0)


def test_a_wrong_rule_is_caught():
    """Sin's backward rule swapped for Cos's: the sweep says wrong, and right again once restored."""
    from engine.lowering.registry import BACKWARD

    case = case_named("test_sin_example")
    assert lower_case(case).status == LOWERED
    sin = BACKWARD["Sin"]
    BACKWARD["Sin"] = BACKWARD["Cos"]
    try:
        outcome = lower_case(case)
    finally:
        BACKWARD["Sin"] = sin
    assert outcome.status == WRONG and "scaled error" in outcome.reason


@pytest.mark.parametrize("name, status", [
    ("test_floor", NOT_APPLICABLE),  # the schema marks no float input differentiable
    ("test_loop11", LOWERED),  # run-time trip count: a recording Loop, then a backward Loop
    ("test_gelu_tanh_1", LOWERED),
    ("test_roialign_aligned_false", REFUSED),
])
def test_statuses(name, status):
    outcome = lower_case(case_named(name))
    assert outcome.status == status, outcome.reason
    if status == REFUSED:
        assert outcome.reason.startswith("cannot lower node") and "RoiAlign" in outcome.reason


def test_docs_table_lists_every_rule_and_refusal():
    """docs/lowering.md's tables name every op that has a rule, and every refusal with its reason."""
    import re

    from engine.lowering.registry import BACKWARD, REFUSED

    text = (ROOT / "docs" / "lowering.md").read_text()
    rules = text[text.index("| Family | Ops |"):text.index("Ops that carry no gradient")]
    named = set(re.findall(r"\b[A-Z][A-Za-z0-9]+\b", rules))
    assert set(BACKWARD) <= named, sorted(set(BACKWARD) - named)
    rows = {}
    for ops, why, _ in _table_rows(text, "| Op | Why |", "Other refusals"):
        rows.update({op.strip(): why for op in ops.split(",")})
    assert rows == REFUSED


def _table_rows(text: str, header: str, after: str) -> list[list[str]]:
    table = text[text.index(header):text.index(after)]
    return [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()[2:] if line.startswith("|")]


def test_docs_sweep_column_follows_the_record():
    """docs/lowering.md's Sweep column (lowered / cases per family, and per refused op) is the recorded sweep:
    an op counts in the first row naming it; the function-body row takes every other op with cases."""
    import collections
    import re

    from engine.conformance.cases import case_info

    text = (ROOT / "docs" / "lowering.md").read_text()
    lowered = collections.Counter(case_info(case_named(n)).op for n in RECORD["lowered"])
    cases = collections.Counter({op: int(m.group(2)) if (m := re.match(r"(\d+)/(\d+) ", note)) else lowered[op]
                                 for op, (_, note) in RECORD["ops"].items()})
    cases.update(case_info(case_named(n)).op for n in _documented_cases())
    rows = [(family, ops, sweep) for family, ops, sweep in _table_rows(text, "| Family | Ops |", "Ops that carry")]
    rows += [(ops, ops, sweep) for ops, _, sweep in _table_rows(text, "| Op | Why |", "Other refusals") if sweep != "–"]
    claimed = {}
    for family, ops, _ in rows:
        if family != "function bodies":  # an op of another domain is named without it (Adam, not ai.onnx.preview.training::Adam)
            words = set(re.findall(r"[A-Za-z][A-Za-z0-9]+", ops))
            claimed[family] = {op for op in cases if op.split("::")[-1] in words} - set().union(*claimed.values())
    claimed["function bodies"] = set(cases) - set().union(*claimed.values()) - _refused_elsewhere()
    for family, _, sweep in rows:
        ops = claimed[family]
        assert sweep == f"{sum(lowered[o] for o in ops)} / {sum(cases[o] for o in ops)}", (family, sorted(ops))
    counted = set().union(*claimed.values()) | _refused_elsewhere()
    assert sum(cases[o] for o in counted) == RECORD["summary"]["applicable"]


def _documented_cases() -> list[str]:
    """The cases the record counts as documented disagreements (they are in no op's note)."""
    from engine.conformance.cases import node_cases
    from engine.conformance.lowered import documented

    names = [c.name for c in node_cases() if documented(c.name) and c.name not in RECORD["lowered"]]
    assert len(names) == RECORD["summary"]["documented"], names
    return names


def _refused_elsewhere() -> set[str]:
    """Ops of the training domain whose cases are all refused before any rule runs: listed under 'Every case
    the sweep does not lower', in no rule row (none since their optimizers are written out)."""
    return {op for op, (status, _) in RECORD["ops"].items() if op.startswith("ai.onnx.preview.training::")
            and status == REFUSED}
