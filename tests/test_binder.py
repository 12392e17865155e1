"""Binder (repo2docker) and the notebooks as committed.

* environment.yml carries exactly the pins of requirements.txt, except the packages that
  requirements.txt lists under a "# --- test-only ... ---" heading, which Binder leaves out.
* postBuild is executable, fails on the first error and runs only a known, small set of commands.
* Every notebooks/*.ipynb names the python3 kernel and is committed without outputs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml  # always present: jupyter_server -> jupyter-events -> pyyaml

REPO = Path(__file__).resolve().parents[1]
ENVIRONMENT = REPO / "environment.yml"
REQUIREMENTS = REPO / "requirements.txt"
POSTBUILD = REPO / "postBuild"
NOTEBOOKS = REPO / "notebooks"

# The whole of postBuild, apart from its shebang, comments and blank lines.
POSTBUILD_COMMANDS = {
    "set -euo pipefail",
    "python -m pip install --no-cache-dir --no-deps -e .",
}
CONDA_PACKAGES = {"python", "pip"}  # everything else goes through pip, pinned as in requirements.txt

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
_HEADING = re.compile(r"^#\s*---\s*(.*?)\s*-*\s*$")


def normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_requirements(path: Path = REQUIREMENTS) -> tuple[dict[str, str], dict[str, str]]:
    """(pins for everyone, test-only pins) from requirements.txt, names normalised.

    A "# --- <title> ---" line starts a section; a section whose title starts with "test-only"
    holds packages that only the tests need. Any line that is not blank, a comment or an exact
    `name==version` pin is an error, so nothing escapes the comparison.
    """
    everyone: dict[str, str] = {}
    test_only: dict[str, str] = {}
    section = everyone
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            heading = _HEADING.match(line)
            if heading:
                section = test_only if heading.group(1).lower().startswith("test-only") else everyone
            continue
        match = _PIN.match(line.split(" #")[0].strip())
        assert match, f"{path.name}:{number}: {raw!r} is not an exact name==version pin"
        name = normalise(match.group(1))
        assert name not in everyone and name not in test_only, f"{path.name}:{number}: {name} is listed twice"
        section[name] = match.group(2)
    return everyone, test_only


def read_environment(path: Path = ENVIRONMENT) -> tuple[dict, dict[str, str], dict[str, str]]:
    """(parsed file, conda dependencies {name: spec}, pip pins {name: version})."""
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name} is not a mapping"
    conda: dict[str, str] = {}
    pip: dict[str, str] = {}
    pip_sections = 0
    for dep in data.get("dependencies") or []:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"{path.name}: unexpected dependency mapping {dep}"
            pip_sections += 1
            for line in dep["pip"] or []:
                match = _PIN.match(str(line).strip())
                assert match, f"{path.name}: pip entry {line!r} is not an exact name==version pin"
                name = normalise(match.group(1))
                assert name not in pip, f"{path.name}: {name} is listed twice under pip"
                pip[name] = match.group(2)
        else:
            match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)$", str(dep).strip())
            assert match, f"{path.name}: cannot read conda dependency {dep!r}"
            conda[normalise(match.group(1))] = match.group(2).strip()
    assert pip_sections == 1, f"{path.name} needs exactly one pip: section, found {pip_sections}"
    return data, conda, pip


# ---- environment.yml ----------------------------------------------------------------------------
def test_environment_channels_and_conda_packages():
    data, conda, _ = read_environment()
    assert data.get("channels") == ["conda-forge"], "use conda-forge only (no defaults channel)"
    assert data.get("name"), "`conda env create -f environment.yml` needs a name"
    assert set(conda) == CONDA_PACKAGES, (
        f"conda packages {sorted(conda)}: put every other package under pip: with its requirements.txt pin")
    assert conda["python"] == "=3.11", f"python is {conda['python']!r}; CI tests Python 3.11"


def test_environment_pins_match_requirements():
    everyone, test_only = read_requirements()
    _, _, pip = read_environment()
    missing = sorted(set(everyone) - set(pip))
    assert not missing, (f"in requirements.txt but not in environment.yml: {missing} (add them with the same "
                         "pin, or list packages only the tests need under '# --- test-only ---' in requirements.txt)")
    leaked = sorted(set(test_only) & set(pip))
    assert not leaked, f"test-only packages must stay off Binder: {leaked}"
    extra = sorted(set(pip) - set(everyone))
    assert not extra, f"in environment.yml but not in requirements.txt: {extra}"
    differ = {name: (everyone[name], pip[name]) for name in everyone if everyone[name] != pip[name]}
    assert not differ, f"pins differ (requirements.txt, environment.yml): {differ}"


def test_requirements_parser_sees_sections(tmp_path):
    """The rule above, on a small file: headings switch sections; a stray line is an error."""
    path = tmp_path / "requirements.txt"
    path.write_text("# --- core ---\nFlask==3.1.3\n# --- test-only: not on Binder ---\n"
                    "pytest==9.2.0\n# --- more ---\nzope.interface==7.0\n")
    assert read_requirements(path) == ({"flask": "3.1.3", "zope-interface": "7.0"}, {"pytest": "9.2.0"})
    path.write_text("flask>=3\n")
    with pytest.raises(AssertionError, match="not an exact"):
        read_requirements(path)


# ---- postBuild ----------------------------------------------------------------------------------
def test_postbuild_is_executable_and_small():
    assert POSTBUILD.is_file(), "postBuild is missing (repo2docker runs it after environment.yml)"
    assert os.access(POSTBUILD, os.X_OK), "postBuild must be executable (chmod +x postBuild)"
    lines = POSTBUILD.read_text().splitlines()
    assert lines and lines[0].startswith("#!") and "bash" in lines[0], "postBuild needs a bash shebang"
    commands = [line.strip() for line in lines[1:] if line.strip() and not line.strip().startswith("#")]
    assert commands and re.match(r"^set -[a-z]*e", commands[0]), "postBuild must start with `set -e...`"
    unknown = [c for c in commands if c not in POSTBUILD_COMMANDS]
    assert not unknown, f"postBuild runs commands outside the agreed set: {unknown}"
    assert "python -m pip install --no-cache-dir --no-deps -e ." in commands, "postBuild must install the course's code"


def test_postbuild_is_executable_in_git():
    """repo2docker clones the repository, so the executable bit must be in git's index too."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(["git", "ls-files", "--stage", "--", "postBuild"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split()
    if not out:
        pytest.skip("postBuild is not committed yet")
    assert out[0] == "100755", f"git records postBuild as {out[0]}; run `git update-index --chmod=+x postBuild`"


# ---- notebooks as committed ---------------------------------------------------------------------
def notebook_problems(path: Path) -> list[str]:
    """What is wrong with a notebook as committed: wrong kernel, outputs, execution counts."""
    try:
        nb = json.loads(path.read_text())
    except ValueError as err:
        return [f"not valid JSON ({err})"]
    problems = []
    if nb.get("nbformat") != 4:
        problems.append(f"nbformat {nb.get('nbformat')}, expected 4")
    kernel = ((nb.get("metadata") or {}).get("kernelspec") or {}).get("name")
    if kernel != "python3":
        problems.append(f"kernelspec name is {kernel!r}, expected 'python3' (else JupyterLab asks for a kernel)")
    for index, cell in enumerate(nb.get("cells") or []):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            problems.append(f"cell {index} has outputs")
        if cell.get("execution_count") is not None:
            problems.append(f"cell {index} has execution_count {cell['execution_count']}")
    return problems


def committed_notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def test_notebooks_are_clean():
    """Passes with no notebooks; otherwise every one must be clean (run nbstripout to fix)."""
    found = {str(p.relative_to(REPO)): notebook_problems(p) for p in committed_notebooks()}
    bad = {name: problems for name, problems in found.items() if problems}
    assert not bad, "notebooks to clean (nbstripout notebooks/*.ipynb):\n" + "\n".join(
        f"  {name}: {'; '.join(problems)}" for name, problems in bad.items())


def test_notebook_check_catches_problems(tmp_path):
    """The check itself, so it is known to work before any lesson exists."""
    clean = {"nbformat": 4, "nbformat_minor": 5,
             "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
             "cells": [{"cell_type": "markdown", "metadata": {}, "source": "# hi"},
                       {"cell_type": "code", "metadata": {}, "source": "1", "outputs": [], "execution_count": None}]}
    path = tmp_path / "clean.ipynb"
    path.write_text(json.dumps(clean))
    assert notebook_problems(path) == []

    dirty = json.loads(json.dumps(clean))
    dirty["metadata"]["kernelspec"]["name"] = "course-env"
    dirty["cells"][1].update(execution_count=3, outputs=[{"output_type": "execute_result", "data": {"text/plain": "1"},
                                                          "metadata": {}, "execution_count": 3}])
    path.write_text(json.dumps(dirty))
    problems = notebook_problems(path)
    assert any("kernelspec" in p for p in problems)
    assert "cell 1 has outputs" in problems and "cell 1 has execution_count 3" in problems


# ---- convenience config --------------------------------------------------------------------------
def test_pre_commit_strips_notebooks():
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = {hook["id"] for repo in config["repos"] for hook in repo["hooks"]}
    assert "nbstripout" in hooks
