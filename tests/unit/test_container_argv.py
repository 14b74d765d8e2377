"""Each runtime's command line (contract/container/): what the ranks start in, flag by flag, and the dry run's sbatch
script that shows it. Apptainer cannot run here: its flags are checked against the ones Apptainer documents."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from contract.container.mounts import Mount, automatic, checkout_mount, outermost
from contract.container.runtimes import PODMAN_ULIMITS, pyxis_srun_args, wrap
from contract.container.spec import PASSED_ENV, Spec
from tests.conftest import hq, launch

# `apptainer exec`'s flags as Apptainer registers them for its action commands (cmd/internal/cli/action_flags.go,
# apptainer/apptainer; the same list as `apptainer exec --help` and the man page apptainer-exec(1)).
APPTAINER_EXEC_FLAGS = {
    "--add-caps", "--allow-setuid", "--app", "--apply-cgroups", "--bind", "-B", "--cleanenv", "-e", "--compat",
    "--containall", "-C", "--contain", "-c", "--disable-cache", "--dns", "--drop-caps", "--fakeroot", "-f",
    "--fusemount", "--home", "-H", "--hostname", "--ipc", "-i", "--keep-privs", "--mount", "--net", "-n",
    "--network", "--network-args", "--no-home", "--no-mount", "--no-init", "--no-privs", "--nv", "--nvccli",
    "--rocm", "--overlay", "-o", "--pid", "-p", "--cwd", "--pwd", "--scratch", "-S", "--security", "--userns", "-u",
    "--uts", "--workdir", "-W", "--writable", "-w", "--writable-tmpfs", "--env", "--env-file", "--no-umask",
    "--no-eval", "--unsquash",
}
# Flags that take a value as the next word (the others are switches).
APPTAINER_VALUED = {"--bind", "-B", "--env", "--pwd", "--cwd", "--home", "--overlay", "--workdir", "--mount"}


def spec(runtime: str, **kw) -> Spec:
    base = dict(runtime=runtime, image="/images/x.img", python="/opt/st/bin/python",
                mounts=(Mount("/runs", "/runs"), Mount("/data", "/data", read_only=True)),
                env={"SLURMTRAIN_CONTAINER": runtime, "FOO": "a b"}, workdir="/proj")
    base.update(kw)
    return Spec(**base)


def test_apptainer_uses_only_documented_flags():
    argv = wrap(spec("apptainer", gpus=True))
    assert argv[:2] == ["apptainer", "exec"]
    image_at = argv.index("/images/x.img")
    assert argv[image_at + 1:] == ["/opt/st/bin/python"]
    words, i = argv[2:image_at], 0
    while i < len(words):
        assert words[i] in APPTAINER_EXEC_FLAGS, f"{words[i]} is not an apptainer exec flag"
        i += 2 if words[i] in APPTAINER_VALUED else 1
    assert i == len(words)
    pairs = list(zip(words, words[1:], strict=False))
    assert ("--bind", "/runs:/runs") in pairs and ("--bind", "/data:/data:ro") in pairs
    assert ("--env", "FOO=a b") in pairs and ("--pwd", "/proj") in pairs
    assert "--nv" in words and "--no-home" in words
    assert "--nv" not in wrap(spec("apptainer", gpus=False))
    assert "--no-home" not in wrap(spec("apptainer", mount_home=True))


def test_charliecloud_binds_and_separates_the_command(monkeypatch):
    monkeypatch.delenv("USER", raising=False)
    assert wrap(spec("charliecloud"))[:2][0] == "env"  # ch-run refuses to start without $USER
    monkeypatch.setenv("USER", "someone")
    argv = wrap(spec("charliecloud", mounts=(Mount("/runs", "/runs"), Mount("/tmp/x", "/tmp/x"))))
    assert argv[0] == "ch-run"
    assert argv[-3:] == ["/images/x.img", "--", "/opt/st/bin/python"]
    assert argv[1] == "--unset-env=PYTHONPATH"  # the host's Python path never reaches the image's interpreter
    assert "-b" in argv and argv[argv.index("-b") + 1] == "/runs:/runs"
    assert "/tmp/x:/tmp/x" not in argv  # the host's /tmp is the container's already
    assert "--set-env=FOO=a b" in argv and "--cd=/proj" in argv
    assert max(i for i, a in enumerate(argv) if a.startswith("--unset-env")) < argv.index("--set-env=FOO=a b")
    private = wrap(spec("charliecloud", mounts=(Mount("/tmp/x", "/tmp/x"),), flags=("--private-tmp",)))
    assert "/tmp/x:/tmp/x" in private


def test_podman_host_network_signals_and_environment():
    argv = wrap(spec("podman", gpus=True))
    assert argv[:3] == ["podman", "run", "--rm"]
    for flag in ("--sig-proxy=true", "--network=host", "--ipc=host"):
        assert flag in argv
    pairs = list(zip(argv, argv[1:], strict=False))
    assert ("-v", "/data:/data:ro") in pairs and ("-w", "/proj") in pairs and ("-e", "FOO=a b") in pairs
    assert ("-e", "SLURM_*") in pairs and ("-e", "MASTER_PORT") in pairs
    assert ("--device", "nvidia.com/gpu=all") in pairs
    assert "nvidia.com/gpu=all" not in wrap(spec("podman"))
    assert argv[-2:] == ["/images/x.img", "/opt/st/bin/python"]


def test_podman_site_flags_follow_containers_conf(tmp_path, monkeypatch):
    conf = tmp_path / "containers.conf"
    conf.write_text('[engine]\nruntime = "crun"\n[containers]\ndefault_ulimits = ["nofile=1:1"]\n')
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))
    argv = wrap(spec("podman"))
    assert "--runtime=runc" not in argv and not set(PODMAN_ULIMITS) & set(argv)
    conf.write_text("[engine]\n# runtime = \"crun\"\n")
    argv = wrap(spec("podman"))
    if not any(Path(p).is_file() and "runtime" in Path(p).read_text() for p in
               ("/etc/containers/containers.conf", "/usr/share/containers/containers.conf")):
        assert "--runtime=runc" in argv and set(PODMAN_ULIMITS) <= set(argv)


def test_enroot_passes_the_ranks_environment_at_start(tmp_path):
    s = spec("enroot")
    argv = wrap(s)
    assert argv[:2] == ["bash", "-c"] and argv[3] == "enroot"
    assert argv[-4:] == [s.name, "env", "--chdir=/proj", "/opt/st/bin/python"]
    assert "/data:/data:none:x-create=auto,rbind,ro" in argv
    # The wrapper itself: what `enroot start` receives, with a stand-in enroot that prints its argv.
    fake = tmp_path / "enroot"
    fake.write_text("#!/bin/bash\nprintf '%s\\n' \"$@\"\n")
    fake.chmod(0o755)
    import os
    import subprocess

    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_PROCID": "3", "WANDB_MODE": "offline",
           "UNRELATED": "x"}
    out = subprocess.run([*argv, "-c", "pass"], env=env, capture_output=True, text=True, check=True).stdout
    words = out.splitlines()
    assert words[0] == "start"
    assert "SLURM_PROCID" in words and "WANDB_MODE" in words and "UNRELATED" not in words
    assert words[-2:] == ["-c", "pass"]


def test_pyxis_srun_flags():
    s = spec("pyxis")
    args = pyxis_srun_args(s)
    assert f"--container-image={s.image}" in args and f"--container-name={s.name}" in args
    assert "--container-mounts=/runs:/runs,/data:/data:ro" in args and "--container-workdir=/proj" in args
    assert "--no-container-mount-home" in args and "--no-container-remap-root" in args
    assert "--container-env=SLURMTRAIN_CONTAINER,FOO" in args
    assert wrap(s) == [s.python]
    flipped = pyxis_srun_args(spec("pyxis", remap_root=True, mount_home=True))
    assert "--container-remap-root" in flipped and "--container-mount-home" in flipped


def test_names_follow_the_image_content(tmp_path):
    image = tmp_path / "a.sqsh"
    image.write_bytes(b"1")
    first = spec("enroot", image=str(image)).name
    assert first == spec("pyxis", image=str(image)).name
    import os

    os.utime(image, ns=(1, 10**18))
    assert spec("enroot", image=str(image)).name != first


def test_automatic_mounts_are_the_outermost_directories(tmp_path):
    (tmp_path / "proj" / "outputs").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    got = automatic(str(tmp_path / "proj" / "outputs"), str(tmp_path / "proj"),
                    [str(tmp_path / "data" / "*.bin"), str(tmp_path / "data" / "x")])
    assert got == [str(tmp_path / "proj"), str(tmp_path / "data")]
    assert outermost(["/a/b", "/a", "/c", "/"]) == ["/a", "/c"]
    assert Mount.parse("/x:/y:ro") == Mount("/x", "/y", True)
    with pytest.raises(ValueError):
        Mount.parse("/x:rel")


def test_the_checkout_goes_where_each_runtime_can_mount_it():
    assert checkout_mount("/work/co", "podman", ["/proj"]) == Mount("/work/co", "/work/co")
    assert checkout_mount("/work/co", "podman", ["/work"]) is None  # the project's mount holds it already
    assert checkout_mount("/work/co", "charliecloud", ["/work"]) == Mount("/work/co", "/mnt")


@pytest.mark.parametrize("runtime, expect", [
    ("pyxis", "--container-image="),
    ("apptainer", "apptainer exec --no-home --bind"),
])
def test_dry_run_shows_the_container_in_the_sbatch_script(tmp_path, run_root, runtime, expect):
    image = tmp_path / ("img.sqsh" if runtime == "pyxis" else "img.sif")
    image.write_bytes(b"not started in a dry run")
    out = launch("+cluster=local_slurm", f"container={runtime}", f"container.image={hq(image)}",
                 "container.python=/opt/slurmtrain/bin/python", f"run.root={hq(run_root)}", "run.name=c",
                 "trainer.max_steps=5", "logger.backend=none", "launcher.dry_run=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    srun = next(line for line in out.stdout.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    assert expect in srun
    assert str(run_root) in srun or str(tmp_path) in srun  # the run root is mounted
    assert words[words.index("-u") - 1] == "/opt/slurmtrain/bin/python"
    assert f"container: {runtime} {image}" in out.stderr
    assert 'scontrol requeue "$job"' in out.stdout  # the batch shell requeues what a rank asks for


def test_passed_names_cover_what_the_ranks_read():
    for name in ("SLURM_PROCID", "MASTER_ADDR", "MASTER_PORT", "WANDB_MODE", "SLURMTRAIN_REQUEUE_DIR",
                 "SUBMITIT_EXECUTOR", "RANK", "WORLD_SIZE"):
        assert any(name.startswith(p) if p.endswith("_") else name == p for p in PASSED_ENV), name


def test_the_batch_shell_requeues_what_a_rank_asked_and_keeps_sruns_code(tmp_path, monkeypatch):
    """A rank's request (ask_host, inside the image) and the batch shell's teardown (outside it), with a stand-in
    scontrol that records its arguments: the real requeue runs in tests/containers (pyxis, SIGUSR1)."""
    import os
    import subprocess

    from contract.container.requeue import REQUEUE_DIR_ENV, ask_host, teardown_lines

    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "scontrol"
    fake.write_text(f"#!/bin/bash\necho \"$@\" >> {tmp_path}/called\n")
    fake.chmod(0o755)
    monkeypatch.setenv(REQUEUE_DIR_ENV, str(tmp_path / "requeue"))
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    assert ask_host("70_3")  # an array task's id, as the rank names it
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    script = "\n".join(["(exit 3)", *teardown_lines()])
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert out.returncode == 3  # srun's own code: the job's state must not read COMPLETED after a failure
    assert (tmp_path / "called").read_text().split() == ["requeue", "70_3"]
    assert not (tmp_path / "requeue" / "77").exists()
    again = subprocess.run(["bash", "-c", "\n".join(["true", *teardown_lines()])], env=env, capture_output=True)
    assert again.returncode == 0 and (tmp_path / "called").read_text().count("requeue") == 1
    monkeypatch.delenv(REQUEUE_DIR_ENV)
    assert not ask_host("70_3")  # outside a container job: the rank runs scontrol itself
