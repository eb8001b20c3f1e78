"""Every wait in the tests is bounded: a stuck child, thread or server fails its test
with a message instead of holding the run until pytest's own timeout."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from iolib.cli.bench.s3server import _first_line

TESTS = Path(__file__).resolve().parent
SUBPROCESS_CALLS = ("run", "check_output", "check_call", "call")


def _unbounded(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, call) of each subprocess call without `timeout=` and each `.join()` or
    `.wait()` with no argument (a thread's, a process's, an event's or a barrier's)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, ast.unparse(node.func.value)
        keywords = {k.arg for k in node.keywords}
        child = owner == "subprocess" and name in SUBPROCESS_CALLS and "timeout" not in keywords
        waits = name in ("join", "wait") and not node.args and not keywords
        if child or waits:
            found.append((node.lineno, ast.unparse(node.func)))
    return found


def test_no_test_waits_without_a_bound() -> None:
    offenders = [
        f"{path.relative_to(TESTS)}:{line} {call}()"
        for path in sorted(TESTS.rglob("*.py"))
        for line, call in _unbounded(ast.parse(path.read_text()))
    ]
    assert not offenders, "unbounded waits:\n" + "\n".join(offenders)


def test_the_scan_finds_each_kind_of_unbounded_wait() -> None:
    code = "subprocess.run(['x'])\nt.join()\nevent.wait()\nsubprocess.run(['x'], timeout=5)\n"
    code += "t.join(5)\n', '.join(parts)\n"
    assert [line for line, _ in _unbounded(ast.parse(code))] == [1, 2, 3]


def test_a_server_that_never_says_its_port_is_given_up_on() -> None:
    """moto's server is started in a child that prints its port: one that never does
    (stuck importing, say) is waited for a bounded time, then reported."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert _first_line(child, 0.5) == ""
    finally:
        child.kill()
        child.wait(timeout=10)
