"""check(forward=True) and check(order=2, second_order="hvp"): forward mode under the verifier's rules.

J·v is compared with float64 central differences along v, <u, J·v> with <Jᵀu, v> (reverse mode) by
their rounding, H·v (forward over reverse) with central differences of the gradient along v. A wrong
JVP (a custom op's hand-written rule) and a wrong VJP must fail; the sample models must pass; an op
without a forward rule leaves the forward part inconclusive, named in one line.
"""
from __future__ import annotations

import json

import pytest
import torch

import engine
from engine import examples
from engine.cli import main
from engine.conformance.mutants import Mutant, candidates, injected
from engine.errors import OnnxGradError
from engine.verify.context import build
from engine.verify.forward import _transpose_verdict
from tests.verify_models import SAMPLES

SAMPLE_CASES = {  # name: (y, xs, zs)
    "spec_conv_gemm": ("Y", ["W", "Z"], ["X"]),
    "spec_grad_wrt_h": ("Y", ["H", "Z"], []),
    "mlp": ("loss", ["W1", "b1", "W2", "b2"], ["X", "T"]),
    "small_cnn": ("logits", ["X", "conv1_W", "bn_scale", "bn_B", "fc_W"], []),
    "transformer_block": ("loss", ["X", "Wq", "Wk", "Wv", "Wo", "ln1_scale", "W1", "W2"], []),
    "transformer_block_fp16": ("loss", ["X", "Wq", "ln1_scale", "W2"], []),
    "lstm_step": ("loss", ["X", "W", "R", "B", "initial_h", "initial_c"], []),
    "residual_fanout": ("loss", ["X", "W"], []),
    "spec_second_order": ("O", ["X", "W"], ["L"]),
    "handwritten_backward": ("y", ["W", "X"], []),
}


def _forward(a):
    return a * a + torch.sin(a)


def _vjp(grads, inputs, outputs):
    (g,), (a,) = grads, inputs
    return (g * (2 * a + torch.cos(a)),)


def _right(t, a):
    return t * (2 * a + torch.cos(a))


def _half_zero(t, a):
    out = _right(t, a).reshape(-1).clone()
    out[out.numel() // 2:] = 0
    return out.reshape(t.shape)


WRONG_JVPS = {  # how hand-written forward rules go wrong
    "scale_1.05": lambda t, a: 1.05 * _right(t, a),
    "sign": lambda t, a: -_right(t, a),
    "drop_factor": lambda t, a: t,
    "zero_part": _half_zero,
    "no_cos": lambda t, a: t * 2 * a,
    "scale_1.001": lambda t, a: 1.001 * _right(t, a),
}


def _custom_check(rule, **kw):
    """check(forward=True) of engine.examples.custom_op with MyCustomOp's JVP `rule(t, a)` (None: none)."""
    jvp = None if rule is None else (lambda tangents, inputs, outputs: rule(tangents[0], inputs[0]))
    with engine.register_op_with_vjp("MyCustomOp", _forward, _vjp, domain="com.example", jvp=jvp):
        model = engine.load(examples.custom_op())
        return engine.check(model, "Y", ["X"], forward=True, **kw)


@pytest.mark.parametrize("name", sorted(SAMPLE_CASES))
@pytest.mark.parametrize("mode", ["fast", "auto"])
def test_the_sample_models_pass_forward_and_transpose(name, mode):
    y, xs, zs = SAMPLE_CASES[name]
    r = engine.check(f"{SAMPLES}/{name}.onnx", y, xs, zs, mode=mode, forward=True)
    assert r.forward and r.verdict == "pass", r.summary()
    assert [j.name for j in r.jvp] == xs and [t.name for t in r.transpose] == xs
    for j in r.jvp:
        assert j.status == "pass" and j.kind == "tangent" and j.checked == j.total > 0
        assert j.max_rel_err < 1e-6 and j.fd_error < 1e-3 * max(abs(j.analytic), abs(j.numeric)) + 1e-12
    for t in r.transpose:
        assert t.status == "pass" and t.abs_err <= t.error_estimate <= 1e-3 * t.signal


def test_kinks_leave_the_forward_check_inconclusive_never_failed():
    r = engine.check(f"{SAMPLES}/kinks.onnx", "loss", ["X", "Y"], forward=True)
    assert r.verdict == "inconclusive"
    assert all(j.status == "inconclusive" and "not differentiable" in j.reason for j in r.jvp)
    assert all(t.status != "fail" for t in r.transpose)


def test_a_right_custom_jvp_passes():
    r = _custom_check(_right)
    assert r.verdict == "pass", r.summary()
    assert r.jvp[0].status == "pass" and r.transpose[0].status == "pass"


@pytest.mark.parametrize("kind", [k for k in WRONG_JVPS if k != "scale_1.001"])
def test_a_wrong_custom_jvp_fails_both_forward_checks(kind):
    r = _custom_check(WRONG_JVPS[kind])
    assert r.verdict == "fail", r.summary()
    assert [x.status for x in r.results] == ["pass"]  # the VJP is right: only forward mode lies
    assert r.jvp[0].status == "fail" and r.jvp[0].failed > 0
    t = r.transpose[0]
    assert t.status == "fail" and t.abs_err > 4 * t.error_estimate


def test_a_jvp_off_by_a_thousandth_fails_the_transpose_identity():
    """The identity is judged by rounding, not by finite differences' tolerance."""
    r = _custom_check(WRONG_JVPS["scale_1.001"])
    t = r.transpose[0]
    assert r.verdict == "fail" and t.status == "fail"
    assert t.error_estimate < 1e-9 * t.signal < t.abs_err


def test_an_op_without_a_forward_rule_is_inconclusive_and_named():
    r = _custom_check(None)
    assert r.verdict == "inconclusive" and [x.status for x in r.results] == ["pass"]
    for part in (*r.jvp, *r.transpose):
        assert part.status == "inconclusive"
        assert "'custom'" in part.reason and "no forward-mode rule" in part.reason and "\n" not in part.reason


def test_a_wrong_vjp_fails_the_transpose_identity_but_not_jv():
    """The VJP mutants of engine/conformance/mutants.py spoil only the backward: J·v stays right."""
    with injected(Mutant("Gemm", "scale_1.05", 0)):
        model = engine.load(f"{SAMPLES}/mlp.onnx")
        r = engine.check(model, "loss", ["W1", "W2"], ["X", "T"], mode="fast", forward=True, locate=False)
    assert r.verdict == "fail"
    assert [j.status for j in r.jvp] == ["pass", "pass"]
    assert "fail" in [t.status for t in r.transpose]


def test_the_transpose_identity_alone_kills_every_vjp_mutant_of_residual_fanout():
    """Every mutant of the catalogue that moves the gradient by 1% fails <u, J·v> = <Jᵀu, v>, while
    J·v (forward mode, which the mutants leave alone) still passes its finite differences."""
    path = f"{SAMPLES}/residual_fanout.onnx"
    ctx = build(engine.load(path), "loss", ["X", "W"], [], None, None, 0, "cpu", False)
    right = torch.cat([ctx.grads64[x].reshape(-1) for x in ("X", "W")])
    killed = 0
    for mutant in candidates(ctx):
        with injected(mutant):
            model = engine.load(path)
            wrong = build(model, "loss", ["X", "W"], [], None, None, 0, "cpu", False)
            moved = torch.cat([wrong.grads64[x].reshape(-1) for x in ("X", "W")]) - right
            if float(moved.norm()) < 0.01 * float(right.norm()):
                continue
            r = engine.check(model, "loss", ["X", "W"], mode="fast", forward=True, locate=False)
        assert "fail" in [t.status for t in r.transpose], mutant.label
        assert [j.status for j in r.jvp] == ["pass", "pass"], mutant.label
        killed += 1
    assert killed >= 30


@pytest.mark.parametrize("lhs, rhs, allowed, status", [
    (1.0, 1.0, 1e-15, "pass"),  # within the allowance, which is small against the value
    (1e-12, 1e-12 + 1e-27, 1e-14, "inconclusive"),  # within it, but it dwarfs the value: terms cancel
    (1.0, 1.0 + 3e-14, 1e-14, "inconclusive"),  # beyond it, but not FAIL_FACTOR times
    (1.0, 1.0 + 1e-13, 1e-14, "fail"),
    (float("nan"), 1.0, 1e-14, "fail"),
])
def test_the_transpose_verdict_needs_its_numbers(lhs, rhs, allowed, status):
    diff, signal = abs(lhs - rhs), max(abs(lhs), abs(rhs))
    assert _transpose_verdict(lhs, rhs, diff, signal, allowed)[0] == status


@pytest.mark.parametrize("name", ["spec_conv_gemm", "mlp", "small_cnn", "transformer_block", "lstm_step"])
def test_second_order_by_hvp_passes_the_samples_and_agrees_with_gradgrad(name):
    y, xs, zs = SAMPLE_CASES[name]
    hvp = engine.check(f"{SAMPLES}/{name}.onnx", y, xs, zs, mode="fast", order=2, second_order="hvp")
    assert hvp.verdict == "pass" and hvp.second_order_method == "hvp", hvp.summary()
    assert all(r.kind == "tangent" and r.status == "pass" for r in hvp.second_order)
    gg = engine.check(f"{SAMPLES}/{name}.onnx", y, xs, zs, mode="fast", order=2)
    assert gg.second_order_method == "gradgrad" and [r.status for r in gg.second_order] == ["pass"] * len(xs)


def test_second_order_by_hvp_fails_a_vjp_right_only_at_first_order():
    """A VJP built from detached inputs is right, but its own derivative is not: H·v must fail."""
    def flat_vjp(grads, inputs, outputs):
        (g,), (a,) = grads, inputs
        return (g * (2 * a + torch.cos(a)).detach(),)

    with engine.register_op_with_vjp("MyCustomOp", _forward, flat_vjp, domain="com.example", jvp=
                                     lambda tangents, inputs, outputs: _right(tangents[0], inputs[0])):
        model = engine.load(examples.custom_op())
        r = engine.check(model, "Y", ["X"], order=2, second_order="hvp", locate=False)
    assert [x.status for x in r.results] == ["pass"]
    assert r.verdict == "fail" and r.second_order[0].status == "fail", r.summary()


def test_second_order_by_hvp_through_an_op_without_a_forward_rule_is_inconclusive():
    with engine.register_op_with_vjp("MyCustomOp", _forward, _vjp, domain="com.example"):
        model = engine.load(examples.custom_op())
        r = engine.check(model, "Y", ["X"], order=2, second_order="hvp")
    assert [x.status for x in r.results] == ["pass"] and r.verdict == "inconclusive"
    assert r.second_order[0].status == "inconclusive" and "no forward-mode rule" in r.second_order[0].reason


def test_hvp_without_order_2_and_an_unknown_method_are_refused():
    with pytest.raises(OnnxGradError, match="order=2"):
        engine.check(f"{SAMPLES}/mlp.onnx", "loss", ["W1"], ["X", "T"], second_order="hvp")
    with pytest.raises(OnnxGradError, match="gradgrad, hvp"):
        engine.check(f"{SAMPLES}/mlp.onnx", "loss", ["W1"], ["X", "T"], order=2, second_order="newton")


# --- the CLI ------------------------------------------------------------------------------------

def test_cli_forward_pass_exits_0_with_the_documented_json(tmp_path, capsys):
    out = tmp_path / "r.json"
    code = main(["check", f"{SAMPLES}/mlp.onnx", "--y", "loss", "--xs", "W1,b2", "--zs", "X,T", "--forward",
                 "--order", "2", "--second-order", "hvp", "--json", str(out), "--junit", str(tmp_path / "r.xml")])
    text = capsys.readouterr().out
    assert code == 0 and "J·v W1" in text and "transpose W1" in text and "H·v W1" in text
    data = json.loads(out.read_text())
    assert data["schema_version"] == 2 and data["forward"] is True and data["second_order_method"] == "hvp"
    assert [j["name"] for j in data["jvp"]] == ["W1", "b2"] and all(j["kind"] == "tangent" for j in data["jvp"])
    assert set(data["transpose"][0]) >= {"name", "status", "forward", "reverse", "abs_err", "rel_err",
                                         "error_estimate", "signal", "roundoff", "reason"}
    assert "onnxgrad.transpose" in (tmp_path / "r.xml").read_text()


def _ops_file(tmp_path, jvp_line: str | None) -> str:
    path = tmp_path / "ops.py"
    jvp = "" if jvp_line is None else f", jvp=lambda t, i, o: {jvp_line}"
    path.write_text("import torch\nimport engine\n"
                    "engine.register_op_with_vjp('MyCustomOp', lambda a: a * a + torch.sin(a),\n"
                    "    lambda g, i, o: (g[0] * (2 * i[0] + torch.cos(i[0])),), domain='com.example'"
                    f"{jvp})\n")
    return str(path)


@pytest.mark.parametrize("jvp_line, code", [("t[0] * (2 * i[0] + torch.cos(i[0]))", 0),
                                            ("t[0] * 2 * i[0]", 1), (None, 3)])
def test_cli_exit_codes_for_a_custom_jvp(tmp_path, capsys, jvp_line, code):
    import onnx

    model = tmp_path / "custom.onnx"
    onnx.save(examples.custom_op(), str(model))
    got = main(["check", str(model), "--y", "Y", "--xs", "X", "--forward", "--ops", _ops_file(tmp_path, jvp_line)])
    out = capsys.readouterr().out
    assert got == code, out
    assert ("no forward-mode rule" in out) == (jvp_line is None)


def test_cli_bad_input_exits_2_in_one_line(capsys):
    code = main(["check", f"{SAMPLES}/mlp.onnx", "--y", "loss", "--xs", "W1", "--zs", "X,T", "--second-order", "hvp"])
    err = capsys.readouterr().err
    assert code == 2 and "order" in err and len(err.strip().splitlines()) == 1
