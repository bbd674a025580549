"""docs/tutorial.md, run as written: its bash blocks in order in one scratch folder (the
variables they export carry to the later blocks), each C++ block (and each Python block whose
first line is `# file: <path>`) written to the file it names, every other Python block run in a
fresh interpreter with the environment the bash blocks left. Between them they scaffold an op,
replace its code, build it as a plugin, use it from NumPy, torch and JAX, and run its tests."""

import os
import subprocess
import sys
from pathlib import Path

from doc_blocks import blocks, runnable

TUTORIAL = Path(__file__).resolve().parents[2] / "docs" / "tutorial.md"
FILE_MARK = "// file: "  # first line of a C++ block: where it goes


def test_the_tutorial_runs_as_written(tmp_path):
    steps = blocks(TUTORIAL, ("bash", "cpp", "python"))
    assert [lang for _, lang, _ in steps].count("python") >= 3 and any(lang == "cpp" for _, lang, _ in steps)
    # The `opforge` command and `python` of this interpreter's environment (a venv may not be on PATH).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "OPFORGE_CACHE_DIR": str(tmp_path / "cache"), "PATH": path}
    env.pop("OPFORGE_PLUGINS", None)
    for line, lang, code in steps:
        where = f"docs/tutorial.md line {line} ({lang})"
        first = code.splitlines()[0]
        mark = FILE_MARK if lang == "cpp" else "# file: "
        if lang == "cpp" or first.startswith(mark):
            assert first.startswith(mark), f"{where}: a C++ block starts with '{mark}<path>'"
            target = tmp_path / first[len(mark):]
            assert target.parent.is_dir(), f"{where}: {target.parent} does not exist at this point"
            target.write_text(code)
        elif lang == "bash":
            dump = tmp_path / "env.txt"
            script = f"set -euo pipefail\n{code}\nenv -0 > {dump}\n"
            done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, f"{where}:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
            env = dict(item.split("=", 1) for item in dump.read_text().split("\0") if "=" in item)
        else:
            done = subprocess.run([sys.executable, "-c", runnable(code)], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, f"{where}:\n{code}\n--- stderr ---\n{done.stderr[-4000:]}"
    assert env.get("OPFORGE_PLUGINS"), "the tutorial's build step exports OPFORGE_PLUGINS"
