"""Every code block of README.md and docs/*.md runs on its own.

A fenced ``python`` block runs in a fresh interpreter; a ``bash`` block runs in
``bash -euo pipefail`` with ``flatradix`` meaning ``python -m flatradix`` of this
checkout. Both run in a fresh temporary directory that holds a link to the
checkout's ``examples/`` (so ``--model-config examples/...`` resolves and output
files land in the temporary directory). Other blocks (``text``, ``json``) are
output or data and are not run. A bash block that runs ``pip`` is not run (it
would change the environment the tests run in).

A block is marked by an HTML comment on the line before its fence (invisible
on GitHub):

* ``<!-- docs-test: skip REASON -->`` -- not run, the reason reported as the skip
  reason (a GPU, the oracle venv, a server, a fragment of a larger program);
* ``<!-- docs-test: slow -->`` -- run with the ``slow`` marker (left out of the
  development subset ``-m "not slow and not oracle"``).

A block that needs an optional dependency that is not installed (torch, pyzmq,
msgspec, matplotlib, tqdm, cupy, Dynamo) is skipped, naming it. Docs other helpers add under ``docs/`` are picked up as they
are.
"""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
RUN = {"python", "py", "bash", "sh", "shell"}
MARK = re.compile(r"<!--\s*docs-test:\s*(skip|slow)\b\s*(.*?)\s*-->")
OPTIONAL = {"torch", "zmq", "msgspec", "matplotlib", "tqdm", "cupy", "dynamo"}
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")


def code_blocks(path):
    """``(line, language, code, mark, reason)`` for each fenced block of ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        i += 1
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARK.search(lines[k]) if k >= 0 else None
        out.append((start + 1, lang, "\n".join(body) + "\n",
                    mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


def _cases():
    cases = []
    for f in FILES:
        for line, lang, code, mark, reason in code_blocks(f):
            if lang not in RUN:
                continue
            marks = []
            if mark == "skip":
                marks.append(pytest.mark.skip(reason=f"docs-test: skip {reason}".strip()))
            elif mark == "slow":
                marks.append(pytest.mark.slow)
            cases.append(pytest.param(f, line, lang, code, marks=marks,
                                      id=f"{f.relative_to(ROOT)}:{line}"))
    return cases


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["MPLBACKEND"] = "Agg"
    return e


@pytest.mark.parametrize("path, line, lang, code", _cases())
def test_code_block_runs_on_its_own(path, line, lang, code, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    if lang in ("python", "py"):
        cmd = [sys.executable, "-c", code]
    else:
        if re.search(r"(^|[\s;&|(])pip3?\s", code):
            pytest.skip("installs packages (pip)")
        prelude = (f'flatradix() {{ "{sys.executable}" -m flatradix "$@"; }}\n'
                   f'python() {{ "{sys.executable}" "$@"; }}\n')
        cmd = ["bash", "-euo", "pipefail", "-c", prelude + code]
    r = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True,
                       timeout=900)
    if r.returncode != 0:
        missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", r.stderr)
        if missing and missing.group(1).split(".")[0] in OPTIONAL:
            pytest.skip(f"needs {missing.group(1)} (an optional dependency)")
    where = f"{path.relative_to(ROOT)}:{line}"
    assert r.returncode == 0, f"{where} exit status {r.returncode}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, f"{where}\n{r.stderr[-3000:]}"


def test_the_readme_starts_with_the_two_setup_commands_ci_runs():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[0] == "# flatradix" and lines[2] == "```bash"
    assert lines[3].startswith("pip install . && flatradix replay ")
    assert lines[4].startswith(
        'pip install torch==2.13.0 -e ".[test,replay,plot,events]" && python -m pytest -q ')
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().splitlines()[-1] == "python -m pytest -q"
    assert 'pip install -q -e ".[test,replay,plot,events]"' in ci and "torch==2.13.0" in ci


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    for f in FILES:
        prose = re.sub(r"`[^`\n]*`", "", f.read_text())      # not inside inline code
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", prose):
            if "://" in target:
                continue
            assert (f.parent / target).exists(), f"{f.relative_to(ROOT)} links to {target}"


def test_the_block_parser_sees_marks_and_indented_blocks(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("a\n\n<!-- docs-test: skip needs a GPU -->\n```python\nx = 1\n```\n\n"
                  "- item\n\n  ```bash\n  echo hi\n  ```\n\n<!-- docs-test: slow -->\n"
                  "```text\nout\n```\n")
    assert code_blocks(md) == [(4, "python", "x = 1\n", "skip", "needs a GPU"),
                               (10, "bash", "echo hi\n", None, ""),
                               (15, "text", "out\n", "slow", "")]
