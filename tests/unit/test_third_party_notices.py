"""Third-party notices silenced where they are harmless (issue 36, item 4; train/observe/quiet.py): launcher.export
--format hf prints neither DeepSpeed's "Setting accelerator to CPU" (on its standard output, which holds only the
export's path) nor torch's single-process checkpoint-loading warning; the filters match only those messages (a
user's own FSDP-wrapped model keeps its view-tensor warning). A tp=2 launch: tests/dist/test_third_party_notices.py;
launcher.evaluate's lm_eval lines: tests/dist/test_harness.py."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

from tests.conftest import ROOT, launcher_env
from tests.hf_checkpoints import bytes_data, write_run
from train.observe import quiet

VIEW = ("FSDP2-wrapped module ({}) returned a view tensor. An in-place op on this view (e.g., `x += y`) will silently "
        "drop the pre-backward hook and skip the all-gather, which can cause backward to fail or produce wrong "
        "gradients.")


def test_launcher_export_prints_its_path_and_its_own_lines_only(tmp_path: Path) -> None:
    run, _ = write_run(tmp_path, "run", bytes_data(tmp_path))
    out = subprocess.run([sys.executable, "-m", "launcher.export", str(run), "--format", "hf"], cwd=ROOT,
                         env=launcher_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == f"{run / 'export' / 'hf_step_5'}\n", out.stdout
    assert "Setting accelerator to CPU" not in out.stderr
    assert "assuming the intent is to load in a single process" not in out.stderr
    assert "export: verified" in out.stderr


def test_the_filters_let_other_messages_through() -> None:
    quiet.fsdp_notices()
    quiet.single_process_load()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet.fsdp_notices()  # the filter goes back on top of the simplefilter above
        warnings.warn(VIEW.format("FSDPTransformer"), UserWarning, stacklevel=1)
        warnings.warn(VIEW.format("FSDPMyModel"), UserWarning, stacklevel=1)
    assert [str(w.message)[:40] for w in caught] == [VIEW.format("FSDPMyModel")[:40]]
    log, seen = logging.getLogger("torch.distributed.tensor._redistribute"), []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        log.warning("While redistributing from %s to %s, 2 sequential all_reduce operations", "a", "b")
        log.warning("something else")
    finally:
        log.removeHandler(handler)
    assert seen == ["something else"]


def test_deepspeeds_build_note_is_dropped_and_the_rest_of_its_output_passed_on(capsys) -> None:  # type: ignore[no-untyped-def]
    with quiet.deepspeed_build_notice():
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully")
        print("a line of DeepSpeed's own that says something")
        print("DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully, and more")
    assert capsys.readouterr().out == ("a line of DeepSpeed's own that says something\n"
                                       "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully, and more\n")
