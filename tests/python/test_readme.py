"""The README's Python examples, run as written: each ```python block in a fresh interpreter, in a
scratch working directory. A line ending in `# SomeError: message` must raise SomeError with that
message, as the README promises; every other line must run without error."""

import subprocess
import sys
from pathlib import Path

import pytest

from doc_blocks import blocks as doc_blocks, runnable

README = Path(__file__).resolve().parents[2] / "README.md"


def blocks():
    return [(line, code) for line, _, code in doc_blocks(README)]


def test_the_readme_has_its_examples():
    assert len(blocks()) >= 4  # NumPy, torch, JAX, forge: a parser that found none would pass below


@pytest.mark.parametrize("line, block", blocks(), ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_example_runs_as_written(tmp_path, line, block):
    done = subprocess.run([sys.executable, "-c", runnable(block)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"README.md line {line}:\n{block}\n--- stderr ---\n{done.stderr[-4000:]}"


def test_an_error_line_that_does_not_raise_fails():
    # The transformation itself: a documented error that does not happen is a failure.
    code = runnable("x = 1  # ValueError: never raised\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "should raise ValueError" in done.stderr
    code = runnable("int('a')  # ValueError: some other message\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0 and "wrong message" in done.stderr
