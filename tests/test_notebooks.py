"""Every lesson notebook: the shape a lesson must have, then executed end to end in quick mode."""

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
MAX_CELL_LINES = 12
QUICK_BUDGET_S = 60  # issue: each notebook runs in <= 60 s in quick mode (loose: noisy shared box)


def lesson_ids():
    return [p.stem for p in NOTEBOOKS]


def read(path):
    return nbformat.read(path, as_version=4)


def markdown(nb) -> str:
    return "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")


def test_there_are_ten_lessons_numbered_in_order():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers == list(range(len(numbers))) and len(numbers) >= 5, [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lesson_ids())
def test_committed_without_outputs_and_with_kernelspec(path):
    nb = read(path)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, f"{path.name}: strip outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lesson_ids())
def test_lesson_has_every_beat_and_thin_cells(path):
    nb = read(path)
    text = markdown(nb).lower()
    first_md = next(c.source for c in nb.cells if c.cell_type == "markdown")
    assert first_md.lstrip().startswith("# "), "a lesson opens with its title"
    for beat in ("objectives", "minutes", "predict", "what you see", "exercise", "key points"):
        assert beat in text, f"{path.name}: missing the '{beat}' beat"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "from helpers" in code[0].source and "lesson_setup()" in code[0].source, \
        f"{path.name}: the first code cell imports from helpers and shows the machine"
    assert "stop_all()" in code[-1].source, f"{path.name}: the last cell is helpers.stop_all()"
    for cell in code:
        lines = [ln for ln in cell.source.splitlines() if ln.strip()]
        assert len(lines) <= MAX_CELL_LINES, f"{path.name}: a {len(lines)}-line cell; move mechanics into helpers"
        assert not re.search(r"^\s*class\s", cell.source, re.M), f"{path.name}: no classes in notebooks"
        assert "import *" not in cell.source
    solutions = [c for c in code if c.metadata.get("jupyter", {}).get("source_hidden")]
    assert len(solutions) >= 2, f"{path.name}: needs >= 2 exercises with collapsed solutions"
    checks = [c for c in code if "self_check(" in c.source or re.search(r"^\s*assert ", c.source, re.M)]
    assert len(checks) >= 2, f"{path.name}: needs >= 2 self-checks"
    assert "prediction" in "\n".join(c.source for c in code), f"{path.name}: no predict-then-run variable"
    if path != NOTEBOOKS[-1]:
        assert re.search(r"\]\((\./)?\d\d-[\w-]+\.ipynb\)", markdown(nb)), f"{path.name}: link the next lesson"


def _orphaned_servers(before: set) -> list[int]:
    """Master pids of course servers started since `before` whose owning kernel is gone."""
    from helpers import running

    return [e["master_pid"] for e in running() if e["master_pid"] not in before and not e["owner_alive"]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lesson_ids())
def test_notebook_runs_clean_in_quick_mode(path, tmp_path):
    from helpers import running

    before = {e["master_pid"] for e in running()}
    nb = read(path)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    os.environ["COURSE_QUICK"] = "1"
    t0 = time.perf_counter()
    client.execute()
    elapsed_s = time.perf_counter() - t0
    errors = []
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                errors.append(f"cell {i}: {out.ename}: {out.evalue}")
            elif out.output_type == "stream" and out.name == "stderr" and "Traceback" in out.text:
                errors.append(f"cell {i}: traceback on stderr")
    assert not errors, f"{path.name}: " + "; ".join(errors)
    figures = sum("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))
    assert figures >= 1 or path.name.startswith("00"), f"{path.name}: no figure rendered"
    deadline = time.monotonic() + 5  # servers die within ~1 s of their kernel
    while _orphaned_servers(before) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = _orphaned_servers(before)
    assert not leftover, f"{path.name}: servers outlived their kernel by 5 s: {leftover}"
    (tmp_path / "executed.ipynb").write_text(json.dumps(nb))
    assert elapsed_s < QUICK_BUDGET_S * 3, f"{path.name}: quick mode took {elapsed_s:.0f} s (target 60 s)"
    print(f"{path.name}: {elapsed_s:.1f} s in quick mode, {figures} figures")
