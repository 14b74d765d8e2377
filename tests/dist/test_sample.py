"""python -m launcher.sample on a run trained with fsdp on 2 ranks on a tiny repeating corpus (a prepared bytes
dataset of "abcdefgh" over and over): the 2-rank checkpoint loads on one process and the model continues the
pattern, from text (the run's tokenizer) and from ids; top-k 1 sampling is greedy; a seed repeats a sample; greedy
output is the same with and without the key/value cache, past the context too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.sample import main
from tests.conftest import ROOT, hq, launch, launcher_env
from tests.prepared_data import write_prepared

pytestmark = pytest.mark.dist

PATTERN = "abcdefgh"
STEPS = 60


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sample runs")
    data = root / "abc data"
    write_prepared(data, [list(PATTERN.encode() * 2000) + [256]], [list(PATTERN.encode() * 100) + [256]])
    out = launch("data=tokens", f"data.path={hq(data)}", "model.vocab_size=257", "strategy=fsdp", "local.nproc=2",
                 f"trainer.max_steps={STEPS}", "optim.lr=3e-3", "optim.warmup_steps=5", "logger.backend=none",
                 f"run.root={hq(root)}", "run.name=abc")
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "abc"


def sample(run_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """python -m launcher.sample as a user runs it (a process of its own, torch imported only to generate)."""
    return subprocess.run([sys.executable, "-m", "launcher.sample", str(run_dir), *args], capture_output=True,
                          text=True, env=launcher_env(), cwd=ROOT, timeout=300)


def sample_here(capsys: pytest.CaptureFixture[str], run_dir: Path, *args: str) -> str:
    """Its main() in this process (torch imported once for all calls): stdout; a failure shows its stderr."""
    code = main([str(run_dir), *args])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_greedy_continues_the_pattern_from_text(run_dir: Path) -> None:
    out = sample(run_dir, "--prompt", "cdef", "--max-new-tokens", "20")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "cdef" + (PATTERN * 4)[6:26] + "\n"
    assert f"checkpoints/step_{STEPS} (greedy, tokenizer bytes)" in out.stderr


def test_ids_in_ids_out_and_top_k_one_is_greedy(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompt = ",".join(str(b) for b in b"gha")
    greedy = sample_here(capsys, run_dir, "--step", str(STEPS), "--tokens", prompt, "--max-new-tokens", "9", "--ids")
    assert greedy.strip() == ",".join(str(b) for b in b"ghabcdefghab")
    top1 = sample_here(capsys, run_dir, "--tokens", prompt, "--max-new-tokens", "9", "--ids", "--temperature", "5",
                       "--top-k", "1", "--seed", "7")
    assert top1 == greedy


def test_sampling_follows_the_seed(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A high temperature over the whole vocabulary: far from greedy, and the same seed gives the same draw.
    args = ["--prompt", "ab", "--max-new-tokens", "40", "--temperature", "3"]
    first, again, other = (sample_here(capsys, run_dir, *args, "--seed", seed) for seed in ("1", "1", "2"))
    assert first == again != other
    assert not first.startswith("ab" + PATTERN[2:] + PATTERN)


def test_greedy_output_is_the_same_with_and_without_the_cache(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 100 new tokens: past the context (model.max_seq_len=64), where the window slides and the cache is left.
    args = ["--prompt", "cdef", "--max-new-tokens", "100"]
    cached, uncached = sample_here(capsys, run_dir, *args), sample_here(capsys, run_dir, *args, "--no-cache")
    assert cached == uncached == "cdef" + (PATTERN * 14)[6:106] + "\n"
    ids = ["--tokens", "1,2,3", "--max-new-tokens", "70", "--ids"]  # an untrained prompt: whatever it continues with
    assert sample_here(capsys, run_dir, *ids) == sample_here(capsys, run_dir, *ids, "--no-cache")
