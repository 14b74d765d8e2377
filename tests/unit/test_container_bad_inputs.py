"""container=... refused as a user types it: one `error:` line naming the fix, exit code 2, nothing created (the
project directory and the run root as they were; no cache entry for an image that was never started). A slurmtrain
version mismatch inside an image needs an image that starts: tests/containers/test_container_runs.py."""

from __future__ import annotations

import pytest

from tests.conftest import hq, launch


def _listing(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def project(tmp_path):
    (tmp_path / "image_dir").mkdir()
    (tmp_path / "image.sif").write_bytes(b"sif")
    return tmp_path


CASES = [
    ("image_missing", ["container=charliecloud", "container.image=/nonexistent/slurmtrain"],
     "container.image=/nonexistent/slurmtrain does not exist"),
    ("sqsh_missing", ["container=enroot", "container.image=/nonexistent/x.sqsh"], "does not exist"),
    ("no_image", ["container=podman"], "needs the image: set container.image="),
    ("unknown_runtime", ["container=foo"], "choose container= one of apptainer, charliecloud, enroot, none, podman"),
    ("not_installed", ["container=apptainer", "container.image={p}/image.sif"],
     "needs apptainer, which is not installed on this machine"),
    ("mount_source_missing", ["container=charliecloud", "container.image={p}/image_dir",
                              "container.mounts=[/nonexistent/src:/data]"],
     "/nonexistent/src does not exist on this machine"),
    ("mount_malformed", ["container=charliecloud", "container.image={p}/image_dir", "container.mounts=[{p}:rel]"],
     "write each as SRC:DST or SRC:DST:ro"),
    ("colliding_flag", ["container=podman", "container.image=localhost/x", "container.flags=[-v,/a:/a]"],
     "container.flags has -v, a flag slurmtrain sets itself for container=podman (from container.mounts): set "
     "container.mounts instead"),
    ("colliding_pyxis_flag", ["+cluster=local_slurm", "container=pyxis", "container.image=nvcr.io/x:1",
                              "container.flags=['--container-mounts=/a:/a']"],
     "set container.mounts instead"),
    ("colliding_own_flag", ["container=charliecloud", "container.image={p}/image_dir", "container.flags=['--cd=/x']"],
     "set container.workdir instead"),
    ("bad_code", ["container=charliecloud", "container.image={p}/image_dir", "container.code=latest"],
     "container.code=latest is not one of auto, image, checkout"),
]


@pytest.mark.parametrize("args, expect", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_refused_in_one_line(project, run_root, args, expect, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    before = _listing(project)
    out = launch(*[a.format(p=project) for a in args], f"run.root={hq(run_root / 'runs')}", "trainer.max_steps=2",
                 "logger.backend=none", cwd=project, XDG_CACHE_HOME=str(cache))
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    assert expect in lines[0]
    assert _listing(project) == before and not (run_root / "runs").exists()
    assert not any(cache.rglob("*.json"))
