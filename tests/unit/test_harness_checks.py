"""Harness tasks refused at launch (issue 30, acceptance 7): an unknown task, a missing include path, a task whose
data is not on disk (a missing file, a Hub dataset, a relative path), a run without a tokenizer, tasks that are never
scored. Each is one `error:` line, exit code 2, and nothing is created (the run root stays absent). The check reads
the tasks' YAMLs without torch (test_login_side_imports walks contract/rules/harness.py too)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from contract.rules.harness import result_values
from tests.conftest import ROOT, hq, launch
from tests.harness_task import TASK, task_yaml, write_pattern_data, write_pattern_task


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("checks") / "dir with space's"
    tasks = write_pattern_task(base / "tasks")
    (tasks / "gone.yaml").write_text(task_yaml("gone", base / "nowhere" / "gone.jsonl"))
    (tasks / "hub.yaml").write_text(task_yaml("hub", "x.jsonl", dataset_path="Rowan/hellaswag"))
    (tasks / "relative.yaml").write_text(task_yaml("relative", "relative/test.jsonl"))
    return {"base": base, "tasks": tasks, "data": write_pattern_data(base / "data")}


def refused(files: dict[str, Path], *overrides: str) -> str:
    root = files["base"] / "runs"
    out = launch("data=tokens", f"data.path={hq(files['data'])}", "model.vocab_size=257", "eval.every=10",
                 f"eval.harness.include_path={hq(files['tasks'])}", f"run.root={hq(root)}", *overrides)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr
    assert not root.exists()
    return out.stderr


@pytest.mark.parametrize(("overrides", "words"), [
    (["eval.harness.tasks=[paterns]"], f"names paterns, which is not a task, group or tag of eval.harness."
                                       f"include_path's YAMLs or lm_eval's own tasks: did you mean {TASK}?"),
    (["eval.harness.tasks=[gone]"], "gone.jsonl, which is not on this disk"),
    (["eval.harness.tasks=[hub]"], "reads 'Rowan/hellaswag' from the Hugging Face Hub, and evaluation runs offline"),
    (["eval.harness.tasks=[relative]"], "reads relative/test.jsonl, a relative path"),
    (["eval.harness.tasks=[hellaswag]"], "task hellaswag reads 'Rowan/hellaswag' from the Hugging Face Hub"),
    ([f"eval.harness.tasks=[{TASK}]", "eval.every=0"], "eval.harness.tasks are never scored: validation is off"),
    ([f"eval.harness.tasks=[{TASK}]", "eval.harness.limit=2.5"], "eval.harness.limit=2.5: give a whole number"),
    ([f"eval.harness.tasks=[{TASK}]", "parallel.pp=2", "local.nproc=2"], "with parallel.pp=2"),
])
def test_a_task_that_cant_run_offline_is_refused_in_one_line(files: dict[str, Path], overrides: list[str],
                                                             words: str) -> None:
    assert words in refused(files, *overrides)


def test_a_missing_include_path_is_refused(files: dict[str, Path]) -> None:
    err = refused(files, f"eval.harness.tasks=[{TASK}]", f"eval.harness.include_path={hq(files['base'] / 'nope')}")
    assert "eval.harness.include_path=" in err and "is not a directory" in err


def test_a_run_without_a_tokenizer_is_refused(files: dict[str, Path]) -> None:
    root = files["base"] / "runs"
    out = launch("eval.every=10", f"eval.harness.tasks=[{TASK}]", f"eval.harness.include_path={hq(files['tasks'])}",
                 f"run.root={hq(root)}")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "eval.harness.tasks need the run's tokenizer" in out.stderr and "synthetic" in out.stderr
    assert "data=tokens data.path=DIR" in out.stderr  # data.path alone is refused: the fix must name the group
    assert not root.exists()


def test_the_check_imports_no_torch(files: dict[str, Path]) -> None:
    code = ("import sys\nfrom omegaconf import OmegaConf\nfrom contract.rules.harness import TaskLookup\n"
            f"print(len(TaskLookup({str(files['tasks'])!r}).leaves({TASK!r})), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "False"], out.stderr


def test_result_keys_name_task_metric_and_keep_a_filter() -> None:
    results = {"pattern": {"alias": "pattern", "acc,none": 0.5, "acc_stderr,none": 0.1},
               "gsm": {"exact_match,strict-match": 0.2, "exact_match_stderr,strict-match": "N/A"}}
    assert result_values(results) == {"harness/pattern/acc": 0.5, "harness/pattern/acc_stderr": 0.1,
                                      "harness/gsm/exact_match,strict-match": 0.2}
