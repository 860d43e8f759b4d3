"""benchmarks/fuzz_models.py's parent counts a child's death or silence as the case it was on, and goes on
from the next case (issue 35: a kill is counted, not fatal). Stand-in children print the lines a real one
would, then kill themselves or hang."""
from __future__ import annotations

import io
import json
import sys
import tempfile

from benchmarks import fuzz_models

CHILD = """
import json, os, signal, sys, time
start, end, bad, how = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for i in range(start, end):
    if i == bad:
        os.kill(os.getpid(), signal.SIGKILL) if how == "kill" else time.sleep(60)
    if i == 11:
        print("a library's chatter on stdout", flush=True)
    print(json.dumps({"i": i, "kind": "bytes", "outcome": "refused", "error": "ModelLoadError"}), flush=True)
"""


def _run(bad: int, how: str) -> tuple[int, list[dict]]:
    lines, errors = io.StringIO(), tempfile.TemporaryFile("w+")  # the child's stderr goes there too: a file
    cmd = [sys.executable, "-c", CHILD, "10", "16", str(bad), how]
    def describe(i):
        return {"kind": "bytes" if i < 13 else "proto", "model": f"m{i % 2}.onnx"}

    go_on = fuzz_models.run_child(cmd, 10, 16, 1.0, describe, lines, errors, startup=5)
    errors.seek(0)
    assert errors.read() == "child stdout: b\"a library's chatter on stdout\"\n"  # kept aside, not a result
    return go_on, [json.loads(line) for line in lines.getvalue().splitlines()]


def test_a_child_killed_by_a_signal_costs_one_case_counted_as_a_kill():
    go_on, records = _run(12, "kill")
    assert go_on == 13
    assert [r["i"] for r in records] == [10, 11, 12]
    assert records[-1] == {"i": 12, "kind": "bytes", "model": "m0.onnx", "outcome": "kill",
                           "message": "child exit -9 (signal 9)"}


def test_a_case_that_sends_nothing_within_the_timeout_is_a_hang_and_its_child_is_killed():
    go_on, records = _run(14, "hang")
    assert go_on == 15
    assert [r["outcome"] for r in records] == ["refused"] * 4 + ["hang"]
    assert records[-1] == {"i": 14, "kind": "proto", "model": "m0.onnx", "outcome": "hang",
                           "message": "no result after 1.0 s"}


def test_a_child_that_finishes_its_slice_hands_on_the_slice_end():
    go_on, records = _run(99, "kill")
    assert go_on == 16 and [r["i"] for r in records] == list(range(10, 16))
