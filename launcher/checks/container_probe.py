"""Start the image once and ask what it holds: slurmtrain's version, Python's and torch's, or why they don't import.

Where: on this node when the runtime is installed here (a local run, or a login node that has it), else as a
one-task `srun` on the cluster's partition (pyxis always: it exists only inside srun). The answer is cached under
~/.cache/slurmtrain/containers/, keyed by the runtime, the image's identity (a file's path, size and mtime; a
reference's text), the interpreter and what the user adds (mounts, variables, flags): a second launch with the same
image starts nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from contract.container.runtimes import PROGRAMS, pyxis_srun_args, wrap
from contract.container.spec import Spec, image_stamp

CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "slurmtrain" / "containers"
MARK = "@slurmtrain-probe"
# The config keys a slurmtrain declares (contract/config/schema.py), as one hash: an image whose copy of slurmtrain
# has the same version but another schema (a checkout ahead of the image it was built from) cannot read this
# launcher's config.yaml. The same code runs here (schema_keys_hash) and inside the image (PROBE).
KEYS_HASH = """
def keys_hash():
    import dataclasses, hashlib, typing
    from contract.config import schema
    def walk(cls, prefix):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            yield prefix + f.name
            args = [hints[f.name], *typing.get_args(hints[f.name])]
            sub = next((a for a in args if dataclasses.is_dataclass(a)), None)
            if sub is not None:
                yield from walk(sub, prefix + f.name + ".")
    return hashlib.sha256("\\n".join(sorted(walk(schema.Config, ""))).encode()).hexdigest()[:16]
"""
PROBE = (KEYS_HASH + "import importlib.metadata as m, sys\n"
         "try:\n    import launcher.worker, submitit\n    v = m.version('slurmtrain')\n    k = keys_hash()\n"
         "except Exception as e:\n    v, k = 'broken: ' + (str(e).splitlines() or [type(e).__name__])[0], '-'\n"
         "try:\n    import torch\n    t = torch.__version__\nexcept Exception as e:\n    t = 'missing'\n"
         f"print({MARK!r}, v, '%d.%d' % sys.version_info[:2], t, k)\n")


def schema_keys_hash() -> str:
    """This launcher's KEYS_HASH."""
    scope: dict[str, Any] = {}
    exec(KEYS_HASH, scope)  # noqa: S102 - our own constant, the very text the probe runs inside the image
    return str(scope["keys_hash"]())


TIMEOUT_S = 300


@dataclasses.dataclass
class Found:
    version: str  # slurmtrain's, `broken: ...` when it does not import, `` when the image did not start
    python: str = ""
    torch: str = ""
    keys: str = ""  # the hash of the config keys its slurmtrain declares (KEYS_HASH)
    where: str = ""  # "this node" or "a one-task srun on partition P"
    cached: bool = False
    error: str = ""  # the runtime's own last words when the image did not start


def _key(spec: Spec, where: str) -> str:
    fields = [spec.runtime, image_stamp(spec.image), spec.python, where, *(m.text() for m in spec.mounts),
              *(f"{k}={v}" for k, v in sorted(spec.env.items())), *spec.flags]
    return hashlib.sha256("\n".join(fields).encode()).hexdigest()[:20]


def probe(spec: Spec, cluster: Any | None) -> Found:
    """What the image holds, from the cache or by starting it (see the module's docstring for where)."""
    here = shutil.which(PROGRAMS[spec.runtime]) is not None and spec.runtime != "pyxis"
    where = "this node" if here or cluster is None else (
        f"a one-task srun on partition {cluster.partition}" if cluster.partition else "a one-task srun")
    cache = CACHE_DIR / f"{_key(spec, where)}.json"
    try:
        found = Found(**json.loads(cache.read_text()))
        found.cached = True
        return found
    except (OSError, ValueError, TypeError):
        pass
    # enroot starts a .sqsh itself (squashfuse), without the `enroot create` a job makes once per node.
    argv = [spec.image if spec.runtime == "enroot" and a == spec.name else a for a in wrap(spec)] + ["-c", PROBE]
    if not here:
        argv = _srun(spec, cluster) + argv
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Found("", where=where, error=f"the image did not answer within {TIMEOUT_S} s")
    found = _parse(out.stdout, where)
    if not found.version:
        words = [line.strip() for line in (out.stderr + out.stdout).splitlines() if line.strip()]
        found.error = (words[-1] if words else f"exit code {out.returncode}")[-300:]
        return found  # not cached: the next launch tries again
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(found)))
    tmp.replace(cache)
    return found


def _parse(stdout: str, where: str) -> Found:
    for line in stdout.splitlines():
        if line.startswith(MARK):
            words = line[len(MARK):].strip().split(" ")
            if words[0] == "broken:":
                return Found(" ".join(words[:-3]), python=words[-3], torch=words[-2], where=where)
            return Found(words[0], python=words[1], torch=words[2], keys=words[3], where=where)
    return Found("", where=where)


def _srun(spec: Spec, cluster: Any) -> list[str]:
    argv = ["srun", "--nodes=1", "--ntasks=1", "--time=5", "--immediate=120", "--quiet"]
    for flag, value in (("partition", cluster.partition), ("account", cluster.account), ("qos", cluster.qos)):
        if value:
            argv.append(f"--{flag}={value}")
    if spec.runtime == "pyxis":
        argv += pyxis_srun_args(spec)
    return argv
