"""Code blocks of the project's Markdown (README.md, docs/), for the tests that run them as written."""

import re
from pathlib import Path

FENCE = re.compile(r"^```(?P<lang>[a-z+]+)\n(?P<body>.*?)^```", re.S | re.M)
RAISES = re.compile(r"^(?P<indent>\s*)(?P<code>\S.*?)\s+# (?P<error>[A-Z]\w*Error): (?P<message>.+)$")


def blocks(path: Path, langs=("python",)) -> list[tuple[int, str, str]]:
    """(line, language, code) of each fenced block in `langs`, in order."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start()) + 1, m["lang"], m["body"]) for m in FENCE.finditer(text)
            if m["lang"] in langs]


def runnable(block: str) -> str:
    """The Python block with each `code  # SomeError: message` line turned into a check that the
    line raises SomeError with that message (a documented error that does not happen fails)."""
    out = []
    for line in block.splitlines():
        m = RAISES.match(line)
        if not m:
            out.append(line)
            continue
        i, code, error, message = m["indent"], m["code"], m["error"], m["message"]
        out += [f"{i}try:", f"{i}    {code}",
                f"{i}except {error} as _e:",
                f"{i}    assert {message!r} in str(_e), f'wrong message: {{_e}}'",
                f"{i}else:",
                f"{i}    raise AssertionError({f'{code} should raise {error}'!r})"]
    return "\n".join(out) + "\n"
