"""The tour, opforge's main job (`opforge tour`): every op with a reference in every framework,
run small so that a broken row fails here and not in front of a user."""

import csv
import importlib
import importlib.util
import shutil
import subprocess

import pytest

import opforge
from opforge import ggml_cpu
from opforge.cli import main


def ops_with_reference():
    return [n for n in opforge._core.op_names() if importlib.util.find_spec(f"opforge.references.{n}")]


def test_every_op_in_every_framework(tmp_path, capsys):
    table = tmp_path / "tour.csv"
    assert main(["tour", "--rows", "8", "--cols", "64", "--repeats", "1", "--csv", str(table)]) == 0
    assert "MISMATCH" not in capsys.readouterr().out
    rows = list(csv.DictReader(open(table)))
    for name in ops_with_reference():
        frameworks = {r["framework"] for r in rows if r["op"] == name}
        with_ggml = hasattr(importlib.import_module(f"opforge.references.{name}"), "ggml") and ggml_cpu.load()
        assert frameworks == {"numpy", "torch", "jax"} | ({"ggml"} if with_ggml else set()), (name, frameworks)
    assert all(float(r["max_error"]) < 1e-4 for r in rows)


@pytest.mark.skipif(ggml_cpu.load() is None, reason="no ggml library (pip install pywhispercpp)")
def test_ggml_rows_time_opforge_against_ggml(tmp_path, capsys):
    table = tmp_path / "tour.csv"
    assert main(["tour", "--frameworks", "ggml", "--rows", "4", "--cols", "64", "--repeats", "1", "--csv",
                 str(table)]) == 0
    rows = {r["op"]: r for r in csv.DictReader(open(table))}
    assert set(rows) == {"quantize_q8_0", "quantize_q4_0", "dequantize"}
    for r in rows.values():
        assert float(r["max_error"]) == 0.0 and r["ratio"] != "nan", r


def test_ggml_rows_are_checked_not_timed(tmp_path, capsys):
    # Their references are NumPy transcriptions of ggml (no framework has the formats): checked
    # under every framework, but no speed ratio is claimed against them.
    table = tmp_path / "tour.csv"
    assert main(["tour", "--frameworks", "jax", "--rows", "4", "--cols", "64", "--repeats", "1", "--csv",
                 str(table)]) == 0
    rows = {r["op"]: r for r in csv.DictReader(open(table))}
    assert rows["quantize_q4_0"]["ratio"] == "nan" and float(rows["quantize_q4_0"]["max_error"]) == 0.0
    assert rows["rms_norm"]["ratio"] != "nan"
    assert "numpy ref" in capsys.readouterr().out


def test_command_line():
    exe = shutil.which("opforge")
    assert exe, "the opforge console script is not installed"
    out = subprocess.run([exe, "tour", "--frameworks", "numpy", "--rows", "4", "--cols", "32", "--repeats", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rms_norm" in out.stdout
