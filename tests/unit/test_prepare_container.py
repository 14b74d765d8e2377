"""python -m launcher.prepare ... +cluster=NAME container=RUNTIME (issue 45, `launcher.prepare` arrays): the same
container group and keys as training's; refusals are one line, exit 2, with nothing read, trained or written; the
job scripts wrap the array's and the finalize job's Python in the runtime. The real run, in Charliecloud on the
local cluster: tests/containers/test_container_runs.py."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from contract.config.container import ContainerConfig
from contract.errors import ConfigError
from launcher.prepare.container import Request, split_overrides, with_container
from launcher.prepare.slurm import executor_parameters, load_cluster
from tests.unit.test_prepare import prepare

# ---------------------------------------------------------------- the command line


def test_container_keys_are_taken_out_as_clusters_are() -> None:
    rest, cluster, overrides, request = split_overrides(
        ["corpus", "--out", "o", "+cluster=local_slurm", "cluster.partition=debug", "container=pyxis",
         "container.image=/i.sqsh", "+container.env.HF_HOME=/h", "container.mounts=[/a:/b]"])
    assert rest == ["corpus", "--out", "o"] and cluster == "local_slurm" and overrides == ["cluster.partition=debug"]
    assert request == Request("pyxis", ("container.image=/i.sqsh", "container.env.HF_HOME=/h",
                                        "container.mounts=[/a:/b]"))
    assert split_overrides(["corpus"])[3] is None


def _corpus(tmp_path: Path) -> Path:
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text("one document\n")
    return tmp_path / "corpus"


CASES = [
    ("no_cluster", ["container=charliecloud", "container.image={p}"],
     "container=charliecloud runs a preparation's SLURM jobs in the image: add +cluster=NAME, or drop container="),
    ("key_without_runtime", ["+cluster=local_slurm", "container.image={p}"],
     "container.image={p} needs container=RUNTIME"),
    ("unknown_runtime", ["+cluster=local_slurm", "container=foo", "container.image={p}"],
     "no container runtime named 'foo': choose container= one of apptainer, charliecloud, enroot, none, podman, "
     "pyxis"),
    ("unknown_key", ["+cluster=local_slurm", "container=charliecloud", "container.imag={p}"],
     "container=charliecloud: Key 'imag' not in 'ContainerConfig'"),
    ("image_missing", ["+cluster=local_slurm", "container=charliecloud", "container.image=/nonexistent/img"],
     "container.image=/nonexistent/img does not exist"),
    ("no_image", ["+cluster=local_slurm", "container=enroot"], "container=enroot needs the image"),
    ("mount_source_missing", ["+cluster=local_slurm", "container=charliecloud", "container.image={p}",
                              "container.mounts=[/nonexistent/src:/data]"], "/nonexistent/src does not exist"),
    ("colliding_flag", ["+cluster=local_slurm", "container=pyxis", "container.image=nvcr.io/x:1",
                        "container.flags=[--container-mounts=/a:/a]"],
     "container.flags has --container-mounts=/a:/a, a flag slurmtrain sets itself for container=pyxis"),
]


@pytest.mark.parametrize("args, expect", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_in_one_line_before_anything_is_written(tmp_path: Path, args: list[str], expect: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    image = tmp_path / "image"
    image.mkdir()
    corpus = _corpus(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    # --train-tokenizer: a refusal must come before the tokenizer is trained (and saved) too
    code, err = prepare(corpus, "--out", tmp_path / "out", "--tokenizer", tmp_path / "tok", "--train-tokenizer",
                        "bpe:300", *[a.format(p=image) for a in args])
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert expect.format(p=image) in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no out/, no tok/, no cache entry


# ---------------------------------------------------------------- the job scripts


def _settled(runtime: str, image: str, out: Path) -> object:
    """The config job_config settles (the probe's part, which starts the image, left to tests/containers)."""
    container = OmegaConf.merge(OmegaConf.structured(ContainerConfig), {
        "runtime": runtime, "image": image, "code": "image", "auto_mounts": [str(out), "/corpus"]})
    cluster = load_cluster("local_slurm", [])
    cluster.gpus_per_node = 0
    return OmegaConf.create({"container": container, "cluster": cluster, "run": {"root": str(out / ".parts")}})


def _script(cfg: object, out: Path) -> str:
    from submitit.slurm.slurm import _make_sbatch_string

    from launcher.prepare.container import job_python

    params = with_container(executor_parameters(load_cluster("local_slurm", []), "prepare-x"), cfg)
    command = f"{job_python(cfg)} -u -m submitit.core._submit {shlex.quote(str(out))}"
    return str(_make_sbatch_string(command=command, folder=out / ".parts" / "slurm", **params))


@pytest.mark.parametrize("runtime, image, words", [
    ("pyxis", "/img/slurmtrain.sqsh", ["--container-image=/img/slurmtrain.sqsh", "--container-name=slurmtrain-",
                                       "--container-mounts={out}:{out},/corpus:/corpus", "--no-container-mount-home"]),
    ("charliecloud", "/img/slurmtrain", ["ch-run ", "-b /corpus:/corpus", "/img/slurmtrain -- python3 -u -m "
                                         "submitit.core._submit"]),
    ("enroot", "/img/slurmtrain.sqsh", ["enroot create --name slurmtrain-", "exec enroot start"]),
    ("apptainer", "/img/slurmtrain.sif", ["apptainer exec --no-home --bind {out}:{out} --bind /corpus:/corpus"]),
])
def test_the_jobs_start_in_the_image(tmp_path: Path, runtime: str, image: str, words: list[str]) -> None:
    out = tmp_path / "out"
    script = _script(_settled(runtime, image, out), out)
    for word in words:
        assert word.format(out=out) in script, script
    assert "--nv" not in script and "nvidia.com/gpu" not in script  # a CPU job: no GPUs asked of the runtime
    assert f"export SLURMTRAIN_REQUEUE_DIR={out}/.parts/.requeue" in script  # never in the dataset itself
    assert script.rstrip().endswith('exit "$srun_code"')


def test_without_a_container_the_jobs_run_this_python(tmp_path: Path) -> None:
    from launcher.prepare.container import job_config, job_python

    assert job_config(None, None, tmp_path, []) == (None, ()) and job_python(None) is None  # submitit's default
    params = executor_parameters(load_cluster("local_slurm", []), "prepare-x")
    assert with_container(params, None) is params


def test_a_container_named_none_is_no_container(tmp_path: Path) -> None:
    from launcher.prepare.container import job_config, refuse_local

    refuse_local(Request("none"))  # container=none: the preparation runs here, as without the key
    assert job_config(Request("none"), None, tmp_path, []) == (None, ())
    with pytest.raises(ConfigError, match=r"container=podman runs a preparation's SLURM jobs"):
        refuse_local(Request("podman"))


def test_job_config_settles_a_cpu_job_with_what_it_reads_mounted(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """job_config on a GPU cluster, with the image's answer given (starting an image is tests/containers' part):
    the preparation's jobs ask the runtime for no GPU, mount the output and what they read, and say which
    slurmtrain they run."""
    from launcher.checks import containers
    from launcher.checks.container_probe import Found, schema_keys_hash
    from launcher.prepare.container import job_config

    monkeypatch.setattr(containers, "probe", lambda spec, cluster: Found(
        containers.this_version(), python="3.11", torch="2.x", keys=schema_keys_hash(), where="a one-task srun"))
    image = tmp_path / "slurmtrain.sif"
    image.write_bytes(b"sif")
    (tmp_path / "corpus").mkdir()
    cluster = load_cluster("local_slurm", ["cluster.gpus_per_node=4"])
    request = Request("apptainer", (f"container.image={image}", "container.mounts=[/etc:/hostetc:ro]"))
    cfg, lines = job_config(request, cluster, tmp_path / "out", [str(tmp_path / "corpus" / "a.txt")])
    assert cluster.gpus_per_node == 4 and cfg.cluster.gpus_per_node == 0
    assert lines[0].startswith(f"container: apptainer {image}; runs the image's slurmtrain ")
    script = _script(cfg, tmp_path / "out")
    assert "--nv" not in script and f"--bind {tmp_path}:{tmp_path}" in script and "/etc:/hostetc:ro" in script
