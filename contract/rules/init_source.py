"""Where `model.init_from` points, resolved without torch (the launcher's plan and the ranks both resolve it).

A safetensors file or a directory of them (a sharded Hugging Face layout names its files in
model.safetensors.index.json), a Hugging Face model directory (`save_pretrained`: safetensors, or
pytorch_model.bin), a torch weights file (.bin, .pt, .pth), one checkpoint (RUN/checkpoints/step_N, written by any
strategy on any world size: DCP, or DeepSpeed's) or a run directory (its newest complete checkpoint). Anything else
is one ConfigError line naming the fix.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from contract.errors import ConfigError
from contract.rundir import ckpt_layout as layout

KEY = "model.init_from"
# Who names the weights when a resume's checkpoint is compared with the model the run's code now builds.
RESUME_KEY = "the checkpoint this run resumes,"
SAFETENSORS = ".safetensors"
TORCH_FILES = (".bin", ".pt", ".pth")
# Where a checkpoint keeps the model (train/checkpoints/manager.py): DCP's metadata file, or DeepSpeed's files.
MODEL_DIR = "model_optim"
WHAT_IT_TAKES = ("a safetensors file or directory, a Hugging Face model directory (save_pretrained), a run "
                 "directory or one of its checkpoints (RUN/checkpoints/step_N)")


@dataclass(frozen=True)
class InitSource:
    kind: str  # "files" (safetensors or torch weight files) | "dcp" | "deepspeed"
    path: Path  # the file, directory or checkpoint the weights are read from
    files: tuple[Path, ...] = ()  # kind "files": the weight files, in order
    run_dir: Path | None = None  # a checkpoint's run (given as the run: its newest complete checkpoint)
    key: str = KEY  # what named the weights, in messages: model.init_from, or an evaluation job's checkpoint

    @property
    def checkpoint(self) -> bool:
        return self.kind in ("dcp", "deepspeed")

    def describe(self) -> str:
        return str(self.path)

    def named(self) -> str:
        """The weights as messages name them: model.init_from=PATH, or "checkpoint PATH"."""
        return named(self.key, self.path)

    def origin(self) -> str:
        """Where a checkpoint found for a run directory came from ('' otherwise), for the plan and the log."""
        return "" if self.run_dir is None else f"; the newest complete checkpoint of {self.run_dir}"


def named(key: str, path: Path) -> str:
    return f"{key}={path}" if key == KEY else f"{key} {path}"


def _indexed(folder: Path, index_name: str) -> tuple[Path, ...] | None:
    """The shards a Hugging Face index (`weight_map`: tensor -> file) names, in order; None without an index."""
    index = folder / index_name
    if not index.is_file():
        return None
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{KEY}={folder}: {index_name} is not a shard index ({type(err).__name__}): restore it "
                          "from where the model came from, or point at one weights file") from None
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"{KEY}={folder}: {index_name} names {missing[0]}, which is not there: copy every shard "
                          "the index names into the directory")
    return tuple(folder / n for n in names)


def _weight_files(folder: Path) -> tuple[Path, ...]:
    """A directory's weights: its safetensors shards (indexed, else every *.safetensors), else its torch files."""
    indexed = _indexed(folder, "model.safetensors.index.json")
    if indexed is not None:
        return indexed
    found = tuple(sorted(folder.glob(f"*{SAFETENSORS}")))
    if found:
        return found
    indexed = _indexed(folder, "pytorch_model.bin.index.json")
    if indexed is not None:
        return indexed
    return tuple(sorted(p for p in folder.iterdir() if p.suffix in TORCH_FILES and p.is_file()))


def check_safetensors_header(path: Path) -> None:
    """A file that says it is safetensors has a readable header (its first 8 bytes give the JSON's length)."""
    try:
        with path.open("rb") as f:
            head = f.read(8)
            (size,) = struct.unpack("<Q", head)
            if size > path.stat().st_size:
                raise ValueError("its header is longer than the file")
            header = json.loads(f.read(size))
        if not isinstance(header, dict):
            raise ValueError("its header is not a table of tensors")
    except (OSError, ValueError, struct.error) as err:
        raise ConfigError(f"{KEY}={path} is not a safetensors file ({str(err).splitlines()[0][:100] or 'unreadable'})"
                          f": point it at {WHAT_IT_TAKES}") from None


def checkpoint_source(step_dir: Path, run_dir: Path | None = None, key: str = KEY) -> InitSource:
    """The model weights of one complete checkpoint (DCP or DeepSpeed); `key` names who asked, in messages."""
    if not (step_dir / layout.MARKER).is_file():
        raise ConfigError(f"{named(key, step_dir)} is an incomplete checkpoint (no {layout.MARKER} marker: it was "
                          "interrupted while saving, or is being written): name a complete one, or the run directory "
                          "for its newest complete checkpoint")
    model_dir = step_dir / MODEL_DIR
    if (model_dir / ".metadata").is_file():
        return InitSource("dcp", step_dir, run_dir=run_dir, key=key)
    if model_dir.is_dir() and any(model_dir.glob("*model_states.pt")):
        return InitSource("deepspeed", step_dir, run_dir=run_dir, key=key)
    raise ConfigError(f"{named(key, step_dir)} has no model weights in {MODEL_DIR}/ (neither DCP's .metadata nor "
                      "DeepSpeed's model states): name another checkpoint")


def _is_checkpoint(folder: Path) -> bool:
    return bool(layout.STEP_DIR.match(folder.name)) and ((folder / MODEL_DIR).is_dir() or
                                                         (folder / layout.MARKER).is_file())


def resolve(text: str) -> InitSource:
    """The weights `model.init_from=text` names; ConfigError (one line, with the fix) for anything else."""
    path = Path(text).expanduser()
    if not path.exists():
        raise ConfigError(f"{KEY}={text} does not exist: point it at {WHAT_IT_TAKES}")
    path = path.resolve()
    if path.is_file():
        if path.suffix == SAFETENSORS:
            check_safetensors_header(path)
            return InitSource("files", path, (path,))
        if path.suffix in TORCH_FILES:
            return InitSource("files", path, (path,))
        raise ConfigError(f"{KEY}={path} is not a weights file (.safetensors, .bin, .pt or .pth): point it at "
                          f"{WHAT_IT_TAKES}")
    if _is_checkpoint(path):
        return checkpoint_source(path)
    run_dir = path.parent if path.name == layout.checkpoints_root(path.parent).name else path
    if layout.checkpoints_root(run_dir).is_dir():
        latest = layout.latest_complete_checkpoint(run_dir)
        if latest is None:
            raise ConfigError(f"{KEY}={path} is a run directory with no complete checkpoint yet: wait for its "
                              "first checkpoint, or name one with RUN/checkpoints/step_N")
        return checkpoint_source(latest.path, run_dir)
    files = _weight_files(path)
    if not files:
        raise ConfigError(f"{KEY}={path} holds no weights (no *.safetensors, no pytorch_model.bin, no checkpoints/): "
                          f"point it at {WHAT_IT_TAKES}")
    for file in files:
        if file.suffix == SAFETENSORS:
            check_safetensors_header(file)
    return InitSource("files", path, files)


def trained_config(src: InitSource) -> Path | None:
    """The config.yaml a checkpoint's weights were trained with: the step's own copy, else its run's; None for
    weights that are no checkpoint, or a checkpoint without either."""
    if not src.checkpoint:
        return None
    run_dir = src.run_dir or src.path.parent.parent  # RUN/checkpoints/step_N
    return next((p for p in (src.path / "config.yaml", run_dir / "config.yaml") if p.is_file()), None)


def hf_config_json(src: InitSource) -> Path | None:
    """The Hugging Face config.json beside weights that are no checkpoint (a save_pretrained directory, or a
    weights file in one); None without one."""
    if src.checkpoint:
        return None
    config = (src.path if src.path.is_dir() else src.path.parent) / "config.json"
    return config if config.is_file() else None


def saved_weights(folder: str) -> Path | None:
    """The weights file a Hugging Face model directory holds, if any (model.config_path's directory: a saved
    model whose weights a run would not load unless model.init_from names them)."""
    p = Path(folder).expanduser()
    p = p if p.is_dir() else p.parent
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json"):
        if (p / name).is_file():
            return p / name
    return None
