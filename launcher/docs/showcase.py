"""The site's pictures of a real run: a tiny local run made when the site is built, then `launcher.report` and
`launcher.status` on it, so the PNGs and the status table in the pages are what this version prints.

A step that fails raises ShowcaseFailed with the command and the end of its output: the build fails, loudly,
instead of publishing stale or missing pictures.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.docs.site import SHOWCASE_PNGS

ROOT = Path(__file__).resolve().parents[2]
# Small enough for a build (about 15 s on one CPU core), long enough for curves worth looking at: warmup, decay
# and two validations.
RUN = ["trainer.max_steps=40", "trainer.log_every=2", "eval.every=10", "local.nproc=1", "logger.backend=none",
       "trainer.progress_bar=false", "run.name=tiny"]
# What the pages show instead of the temporary directory the run was made in.
SHOWN_DIR = "~/project"
TIMEOUT_S = 300


class ShowcaseFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Showcase:
    pngs: dict[str, bytes]  # file name -> contents, as launcher.report wrote them into the run directory
    status: str  # launcher.status's table of the run root


def _run(args: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": "110", "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", *args]
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as err:
        raise ShowcaseFailed(f"the site's showcase run: `{' '.join(command)}` ran past {TIMEOUT_S} s") from err
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise ShowcaseFailed(f"the site's showcase run: `{' '.join(command)}` exited {done.returncode}:\n{tail}")
    return done.stdout


def make_showcase() -> Showcase:
    with tempfile.TemporaryDirectory(prefix="slurmtrain-docs-") as tmp:
        work = Path(tmp)
        _run(["launcher", *RUN], work)
        run_dir = work / "outputs" / "tiny"
        _run(["launcher.report", str(run_dir)], work)
        status = _run(["launcher.status", "outputs"], work)
        missing = [name for name in SHOWCASE_PNGS if not (run_dir / name).is_file()]
        if missing:
            raise ShowcaseFailed(f"the site's showcase run: launcher.report wrote no {', '.join(missing)} into "
                                 f"{run_dir} (launcher/docs/site.py SHOWCASE_PNGS names what the pages show)")
        pngs = {name: (run_dir / name).read_bytes() for name in SHOWCASE_PNGS}
        lines = [line.rstrip() for line in status.replace(str(work.resolve()), SHOWN_DIR).splitlines()]
        return Showcase(pngs, "\n".join(lines).strip("\n"))
