"""bench/bench_gpu.py's own code, run where no GPU is (--dry-run: the CPU, toy sizes, wall clock).

The GPU benchmark runs only in the rare session lent a GPU, inside a time limit; a mistake in the
harness (a new op's sample, a changed reference, the tables) would cost that session its numbers.
Here every op it measures must come out with opforge's row and its competitors', and the tables
must be written. Nothing here looks at the timings.
"""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import opforge

ROOT = Path(__file__).resolve().parents[2]


def bench_gpu():
    """bench/bench_gpu.py as a module (its constants; the run itself is a subprocess)."""
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "bench" / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("bench_gpu")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--dry-run", "--mib", "1",
                           "--repeats", "2", "--no-compile", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "ops_cuda.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return out, rows, proc.stdout


def test_every_op_is_measured(dry_run):
    _, rows, stdout = dry_run
    with_refs = [n for n in opforge._core.op_names()
                 if importlib.util.find_spec(f"opforge.references.{n}") and not n.endswith("_backward")]
    measured = {r["op"] for r in rows if r["impl"] == "opforge"}
    assert set(with_refs) | {"linear_act bfloat16", "matmul_q"} <= measured, stdout[-3000:]
    shapes = {r["shape"] for r in rows if r["op"] == "matmul_q" and r["impl"] == "opforge"}
    assert len(shapes) == 6, shapes  # Q4_0 and Q8_0, against 1, 32 and 512 rows
    for r in rows:  # every row is a rate against a limit, and opforge's speedup over it
        assert float(r["median_us"]) > 0 and float(r["rate"]) > 0 and float(r["opforge_speedup"]) > 0, r
        assert r["unit"] == ("TFLOP/s" if r["op"].startswith("linear_act") else "GB/s"), r


def test_the_issues_ops_have_every_competitor(dry_run):
    _, rows, stdout = dry_run
    impls = {(r["op"], r["impl"]) for r in rows}
    for op in bench_gpu().ISSUE_OPS:  # each against torch eager and jax.jit
        for impl in ("opforge", "torch eager", "jax.jit"):
            assert (op, impl) in impls or impl == "jax.jit" and "jax.jit left out" in stdout, (op, impl)


def test_row_ops_are_measured_on_rows_side_by_side(dry_run):
    """softmax and the norms of x.T (the panel kernels) against torch eager; jax.jit has no such
    layout to compare."""
    _, rows, _ = dry_run
    for op in ("rms_norm x.T", "layer_norm x.T", "softmax x.T"):
        impls = {r["impl"] for r in rows if r["op"] == op}
        assert {"opforge", "torch eager"} <= impls and "jax.jit" not in impls, (op, impls)


def test_ggml_formats_have_no_false_competitors(dry_run):
    """The quantizers' and dequantize's references are NumPy transcriptions (no framework has
    ggml's formats): timing them as "torch eager" would compare a GPU kernel with the host."""
    _, rows, _ = dry_run
    for op in ("quantize_q8_0", "quantize_q4_0", "dequantize"):
        assert {r["impl"] for r in rows if r["op"] == op} == {"opforge"}, op


def test_the_tables_are_written(dry_run):
    out, rows, _ = dry_run
    table = (out / "ops_cuda.md").read_text()
    assert "--dry-run" in table.splitlines()[0]  # a dry run's table says it is one
    for op in {r["op"] for r in rows}:
        assert f"| {op} |" in table, op
    if importlib.util.find_spec("matplotlib"):
        assert (out / "ops_cuda.png").stat().st_size > 0


def test_the_profile_names_every_case(tmp_path):
    """bench/profile_gpu.py (the gpu_check step after the benchmark): every case gets its line of
    wall time and kernel time, and the file is written."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "profile_gpu.py"), "--dry-run", "--calls", "2",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = (tmp_path / "profile_cuda.txt").read_text()
    assert "--dry-run" in text.splitlines()[0]
    for case in ("scatter_add", "quantize_q8_0", "matmul_q q4_0 1x", "matmul_q q8_0 512x"):
        line = next((l for l in text.splitlines() if l.startswith(case)), None)
        assert line and "wall" in line and "kernels" in line, (case, text)


def test_the_counters_script_runs_its_workloads_and_reads_ncu_tables(capsys):
    """bench/ncu_kernels.py (the gpu_check step that reads hardware counters): its profiled program
    runs every workload (here on the CPU), and its reader takes ncu's raw CSV apart, skipping the
    units row and the profiler's own lines."""
    pytest.importorskip("torch")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "ncu_kernels.py"), "--run", "--dry-run"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for label in ("opforge rms_norm", "torch.compile layer_norm", "opforge scatter_add", "opforge matmul_q q8_0 32x"):
        assert f"ran {label}" in proc.stdout, (label, proc.stdout)
    spec = importlib.util.spec_from_file_location("ncu_kernels", ROOT / "bench" / "ncu_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    nvtx = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
    raw = (f'==PROF== Connected to process 1\nran opforge rms_norm\n"ID","{nvtx}","Kernel Name",'
           '"gpu__time_duration.sum","dram__bytes_read.sum","smsp__warp_issue_stalled_barrier_per_warp_active.pct"\n'
           '"","","","nsecond","byte","%"\n'
           '"0","4413  ""<default domain>:opforge rms_norm:none:none:none:none:none:none"" ","rows_kernel<float>",'
           '"98,304","268,435,456","12.5"\n==PROF== Disconnected\n')
    (rows,) = module.table(raw)
    assert rows[0] == "opforge rms_norm", rows
    assert rows[1] == "rows_kernel<float>" and rows[2]["gpu__time_duration.sum"] == "98,304", rows
    # The printed line: the range, the kernel, its time; the barrier stalls read, the others blank.
    module.print_table([rows])
    line = capsys.readouterr().out.splitlines()[-1]
    assert line.startswith("opforge rms_norm: rows_kernel<float>") and " 98.3 " in line and " 12.5 " in line, line
    assert line.split()[-4:] == ["nan", "12.5", "nan", "nan"], line
    # What is written to ncu_kernels.csv: the CSV alone.
    assert [line[:4] for line in module.csv_lines(raw)] == ['"ID"', '"","', '"0",'], module.csv_lines(raw)
