"""Launch-time checks of a user's model, data and config groups: exit code 2, one line naming the fix, nothing
created (the plan asks the model in a child process; these run the real command)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import ROOT, launch

PROJECT = ["--config-dir", "conf", "model=conv_lm", "data=chars"]


def test_a_model_without_blocks_trains_with_ddp_and_fsdp_needs_to_be_told(byo_project: Path, tmp_path: Path) -> None:
    (byo_project / "flat.py").write_text(
        "from torch import nn\n"
        "class Flat(nn.Module):\n"
        "    def __init__(self, vocab_size):\n"
        "        super().__init__()\n"
        "        self.embed, self.head = nn.Embedding(vocab_size, 16), nn.Linear(16, vocab_size)\n"
        "    def forward(self, x):\n"
        "        return self.head(self.embed(x))\n")
    (byo_project / "conf" / "model" / "flat.yaml").write_text(
        "name: flat\n_target_: flat.Flat\nargs:\n  vocab_size: ${model.vocab_size}\n")
    args = ["--config-dir", "conf", "model=flat", "data=chars", f"run.root={tmp_path}", "trainer.max_steps=2",
            "logger.backend=none"]
    out = launch(*args, "strategy=fsdp", cwd=byo_project)
    assert out.returncode == 2 and "no repeated block found in Flat" in out.stderr, out.stderr
    assert "strategy=fsdp shards per block: name the block class with model.block=ClassName" in out.stderr
    assert not any(tmp_path.iterdir())
    told = launch(*args, "strategy=fsdp", "model.block=none", "launcher.dry_run=true", cwd=byo_project)
    assert told.returncode == 0, told.stderr[-2000:]
    # DDP replicates the whole model: it needs no blocks, and is not asked for them (the plan asks the model
    # through the same train/model/blocks.py code the ranks run).
    ddp = launch(*args, "strategy=ddp", "launcher.dry_run=true", cwd=byo_project)
    assert ddp.returncode == 0, ddp.stderr[-2000:]


def test_the_projects_own_groups_are_checked_against_the_schema(byo_project: Path, tmp_path: Path) -> None:
    bad = byo_project / "conf" / "cluster" / "typo.yaml"
    bad.write_text("name: typo\nnodes: 1\npartitoin: debug\n")
    out = launch(*PROJECT, "+cluster=typo", "launcher.dry_run=true", f"run.root={tmp_path}", cwd=byo_project)
    assert out.returncode == 2 and "partitoin" in out.stderr
    plan = launch(*PROJECT, "+cluster=my_cluster", "launcher.dry_run=true", f"run.root={tmp_path}",
                  cwd=byo_project)
    assert plan.returncode == 0, plan.stderr[-2000:]
    # The project's cluster and the parameters counted from the project's model.
    assert "#SBATCH --partition=debug" in plan.stdout and "model 0.1M parameters" in plan.stdout + plan.stderr


def test_a_model_that_cannot_be_built_on_meta_is_planned_from_a_cpu_build(byo_project: Path, tmp_path: Path) -> None:
    # Reading a tensor's value in __init__ fails on the meta device, not on the ranks' real one: the probe builds it
    # on the CPU instead (it is small), and the plan keeps its parameter count and memory check.
    (byo_project / "odd.py").write_text(
        "import torch\n"
        "from model import ConvLM\n"
        "class Odd(ConvLM):\n"
        "    def __init__(self, vocab_size):\n"
        "        super().__init__(vocab_size, dim=32, layers=2)\n"
        "        self.scale = float(torch.ones(1).sum().item())\n")
    out = launch(*PROJECT, "model._target_=odd.Odd", "~model.args.dim", "~model.args.layers", "~model.args.kernel",
                 "~model.args.hidden", "local.nproc=1", "trainer.max_steps=3", "logger.backend=none",
                 f"run.root={tmp_path}", "run.name=odd", cwd=byo_project)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = out.stdout + out.stderr
    assert "memory not estimated" not in plan and "an unknown number of parameters" not in plan
    assert "model 0.0M parameters" in plan and "memory per rank: params 0.00" in plan
    assert (tmp_path / "odd" / "checkpoints" / "step_3" / "COMPLETE").is_file()


def test_a_hugging_face_model_from_pretrained_is_planned_with_a_memory_estimate(tmp_path: Path) -> None:
    # The most common fine-tuning setup: a function that calls from_pretrained(local_dir), which transformers
    # refuses on the meta device.
    from train.model.hf import causal_lm

    causal_lm(str(ROOT / "tests" / "fixtures" / "tiny_llama")).save_pretrained(str(tmp_path / "llama"))
    out = launch("model._target_=tests.fixtures.user_models.hf_from_pretrained", f"+model.args.path={tmp_path}/llama",
                 "strategy=fsdp", "local.nproc=2", "launcher.dry_run=true", f"run.root={tmp_path}/runs")
    assert out.returncode == 0, out.stderr[-2000:]
    plan = out.stdout + out.stderr
    assert "memory not estimated" not in plan
    # 2 x 256 x 64 (embedding, output) + 2 layers x 36,992 + 64 = 106,816 parameters.
    assert "model 0.1M parameters" in plan and "memory per rank: params 0.00" in plan
