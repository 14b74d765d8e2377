"""+remote without a login node: what a snapshot ships and its id, the size refusal, the remote's arguments and
config, ssh's options (launcher/run/remote/). The real sshd: tests/slurm/test_remote.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from contract.config.remote import RemoteConfig
from contract.errors import ConfigError
from contract.remote_snapshot import snapshot_record
from launcher.run.remote import commands, config, launch, snapshot
from launcher.run.remote.ssh import Connection


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _paths(project: Path, **keys: object) -> list[str]:
    return [f.path for f in snapshot.take(project, RemoteConfig(name="t", host="h", **keys)).files]  # type: ignore[arg-type]


PROJECT = {"train.py": "print(1)\n", "pkg/model.py": "x = 1\n", ".env": "KEY=secret\n", "keys/id_ed25519": "k",
           "outputs/run/metrics.jsonl": "{}\n", "pkg/__pycache__/model.cpython-311.pyc": "b", "wandb/run/x": "w",
           "data/big.bin": "0" * 5000, "notes.pem": "p"}


def test_a_directory_ships_every_file_less_the_default_excludes(tmp_path: Path) -> None:
    _write(tmp_path, PROJECT)
    assert _paths(tmp_path) == ["data/big.bin", "pkg/model.py", "train.py"]
    assert _paths(tmp_path, exclude=["data"]) == ["pkg/model.py", "train.py"]


def test_a_git_tree_ships_tracked_and_unignored_files_never_secrets(tmp_path: Path) -> None:
    _write(tmp_path, {**PROJECT, ".gitignore": "data/\n", "new.py": "untracked\n"})
    git = ["git", "-C", str(tmp_path), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-f", "train.py", "pkg/model.py", ".env", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    # Tracked (less the tracked .env), plus untracked files git does not ignore; data/ is ignored.
    assert ".env" not in _paths(tmp_path)
    assert set(_paths(tmp_path)) >= {".gitignore", "new.py", "pkg/model.py", "train.py"}
    assert not any(p.startswith(("data/", "outputs/", "keys/")) or p == "notes.pem" for p in _paths(tmp_path))
    # Untracked bytecode (no .gitignore entry for it) was shipped: each local run's .pyc made a new snapshot.
    assert not any("__pycache__" in p or p.endswith(".pyc") for p in _paths(tmp_path))
    (tmp_path / "train.py").write_text("print(2)\n")
    # A tracked .env changed beside it: its diff (the old secret and the new) was written into the snapshot's
    # manifest and the run's snapshot.diff. And .envrc (direnv's exports) was shipped.
    (tmp_path / ".env").write_text("API_TOKEN=the-new-secret\n")
    (tmp_path / ".envrc").write_text("export API_TOKEN=another-secret\n")
    snap = snapshot.take(tmp_path, RemoteConfig(name="t", host="h"))
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert snap.git is not None and snap.git["commit"] == head and snap.git["dirty"]
    assert "+print(2)" in snap.git["diff"]
    assert "secret" not in snap.git["diff"] and "secret" not in json.dumps(snap.manifest), snap.git["diff"]
    assert ".envrc" not in {f.path for f in snap.files}


def test_the_id_is_the_content(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b dir"
    _write(a, {"train.py": "x\n", "m.py": "y\n"})
    _write(b, {"train.py": "x\n", "m.py": "y\n"})
    remote = RemoteConfig(name="t", host="h")
    assert snapshot.take(a, remote).id == snapshot.take(b, remote).id
    (b / "m.py").write_text("z\n")
    assert snapshot.take(a, remote).id != snapshot.take(b, remote).id
    (b / "m.py").write_text("y\n")
    (b / "m.py").chmod(0o755)
    assert snapshot.take(a, remote).id != snapshot.take(b, remote).id


def test_a_project_over_the_limit_names_what_made_it_big(tmp_path: Path) -> None:
    _write(tmp_path, {"train.py": "x\n", "ckpt/a.bin": "0" * 30_000, "ckpt/b.bin": "0" * 30_000,
                      "corpus.txt": "0" * 20_000})
    with pytest.raises(ConfigError, match=r"is 78.1 KB, over remote.max_snapshot_mb=0.05: most of it is ckpt/ "
                                          r"\(58.6 KB\), corpus.txt \(19.5 KB\)"):
        snapshot.take(tmp_path, RemoteConfig(name="t", host="h", max_snapshot_mb=0.05))


def test_the_manifest_names_the_snapshot_in_the_run_directory(tmp_path: Path) -> None:
    _write(tmp_path, {"train.py": "x\n"})
    snap = snapshot.take(tmp_path, RemoteConfig(name="t", host="h"))
    import json

    (tmp_path / ".slurmtrain-snapshot.json").write_text(json.dumps(snap.manifest))
    assert snapshot_record(str(tmp_path)) == {"id": snap.id, "path": str(tmp_path), "git_commit": None,
                                              "git_dirty": None, "source": str(tmp_path)}
    assert snapshot_record(str(tmp_path / "nowhere")) is None


def test_a_later_launch_of_the_same_content_records_its_own_commit(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that changed no shipped file is the same snapshot, not copied again; the run recorded the manifest's
    commit and diff, the first launch's. The later launch's state is written beside it and named by the env."""
    from contract.remote_snapshot import GIT_STATE_ENV, GIT_STATES, git_state_key, snapshot_diff

    first = {"commit": "a" * 40, "dirty": True, "diff": "+old edit\n"}
    later = {"commit": "b" * 40, "dirty": False, "diff": ""}
    snap = snapshot.Snapshot(tmp_path, [], first, {"format": 1, "id": "0123", "git": first, "source": "/laptop"})
    (tmp_path / ".slurmtrain-snapshot.json").write_text(json.dumps(snap.manifest))
    (tmp_path / GIT_STATES).mkdir()
    (tmp_path / GIT_STATES / f"{git_state_key(later)}.json").write_text(json.dumps(later))
    monkeypatch.delenv(GIT_STATE_ENV, raising=False)
    assert snapshot_record(str(tmp_path))["git_commit"] == "a" * 40  # type: ignore[index]
    assert snapshot_diff(str(tmp_path)) == "+old edit\n"
    monkeypatch.setenv(GIT_STATE_ENV, git_state_key(later))
    assert snapshot_record(str(tmp_path))["git_commit"] == "b" * 40  # type: ignore[index]
    assert snapshot_record(str(tmp_path))["git_dirty"] is False  # type: ignore[index]
    assert snapshot_diff(str(tmp_path)) == ""
    # named but not written (its write failed): unknown, never the manifest's commit, which is another launch's
    monkeypatch.setenv(GIT_STATE_ENV, "f" * 16)
    assert snapshot_record(str(tmp_path))["git_commit"] is None  # type: ignore[index]
    assert snapshot_diff(str(tmp_path)) == ""


def test_the_remote_arguments_are_taken_out_and_the_rest_runs_there(tmp_path: Path) -> None:
    _write(tmp_path, {"conf/remote/mine.yaml": "host: login\nport: 2222\nsetup: ['module load x']\n"})
    args = config.split_args(["-m", "--config-dir", str(tmp_path / "conf"), "+remote=mine", "remote.user=me",
                              "model.args.dim=32,64", "hydra/sweeper=search"])
    assert args is not None and args.name == "mine" and args.overrides == ["remote.user=me"]
    assert args.rest == ["-m", "--config-dir", str(tmp_path / "conf"), "model.args.dim=32,64", "hydra/sweeper=search"]
    remote = config.load(args.name, args.config_dir, args.overrides)
    assert (remote.host, remote.port, remote.user, remote.setup) == ("login", 2222, "me", ["module load x"])
    assert config.split_args(["model=tiny"]) is None
    assert launch._relative_config_dir(["--config-dir", str(tmp_path / "conf")], tmp_path) == ["--config-dir", "conf"]
    with pytest.raises(ConfigError, match="outside the project directory"):
        launch._relative_config_dir(["--config-dir=/etc"], tmp_path)


def test_a_bad_remote_is_one_line(tmp_path: Path) -> None:
    _write(tmp_path, {"remote/typo.yaml": "host: h\nprot: 22\n", "remote/nohost.yaml": "user: me\n"})
    # A misspelt key says what it most likely means (it pointed at contract/config/remote.py, a file of the package)
    with pytest.raises(ConfigError, match=r"remote typo has no key 'prot' \(in .*typo.yaml\): did you mean port\?"):
        config.load("typo", str(tmp_path))
    with pytest.raises(ConfigError, match=r"no key 'hots' \(remote.hots=...\): did you mean host\?"):
        config.load("nohost", str(tmp_path), ["remote.hots=x"])
    with pytest.raises(ConfigError, match=r"no key 'hots' \(remote.hots.x=...\): did you mean host\?"):
        config.load("nohost", str(tmp_path), ["remote.hots.x=1"])
    with pytest.raises(ConfigError, match=r"no key 'zzz' .*: a remote's keys are host, user, port, .*, exclude "):
        config.load("nohost", str(tmp_path), ["remote.zzz=1"])
    with pytest.raises(ConfigError, match="sets no host"):
        config.load("nohost", str(tmp_path))
    with pytest.raises(ConfigError, match="no remote named 'nosuch'.*known: .*nohost, typo"):
        config.load("nosuch", str(tmp_path))
    _write(tmp_path, {"remote/ok.yaml": "host: h\nworkdir: ~/runs/here\n"})
    # the declared ranges: remote.port=0 was silently ignored, max_snapshot_mb=-1 said "over max_snapshot_mb=-1"
    with pytest.raises(ConfigError, match=r"remote.port=0 is out of range: give a value in \[1, 65535\]"):
        config.load("ok", str(tmp_path), ["remote.port=0"])
    with pytest.raises(ConfigError, match=r"remote.max_snapshot_mb=-1.0 is out of range"):
        config.load("ok", str(tmp_path), ["remote.max_snapshot_mb=-1"])
    # a value of the wrong type: OmegaConf's "Value 'abc' of type 'str' could not be converted to Integer" before
    with pytest.raises(ConfigError, match=r"remote ok: remote.port=abc: remote.port takes an integer port 1-65535 "
                                          r"\(ssh -p\): write remote.port=22"):
        config.load("ok", str(tmp_path), ["remote.port=abc"])
    # ssh's ControlPersist checked here (ssh's "Bad ControlPersist argument" was blamed on the connection)
    with pytest.raises(ConfigError, match=r"remote.control_persist=forever: ssh's ControlPersist takes yes, no or a "
                                          r"time .*write remote.control_persist=10m"):
        config.load("ok", str(tmp_path), ["remote.control_persist=forever"])
    _write(tmp_path, {"remote/persist.yaml": "host: h\ncontrol_persist: 10x\n"})
    with pytest.raises(ConfigError, match=r"control_persist in .*persist.yaml: ssh's ControlPersist takes"):
        config.load("persist", str(tmp_path))
    # what ssh accepts is passed as ssh reads it: YAML's `yes` arrived as True, which ssh refused
    for given, passed in (("yes", "yes"), ("no", "no"), ("true", "yes"), ("10m", "10m"), ("600", "600"),
                          ("1h30m", "1h30m")):
        assert config.load("ok", str(tmp_path), [f"remote.control_persist={given}"]).control_persist == passed
        if shutil.which("ssh"):  # and ssh itself reads it (ssh -G parses the options and connects nowhere)
            read = subprocess.run(["ssh", "-G", "-o", f"ControlPersist={passed}", "localhost"], capture_output=True,
                                  text=True)
            assert read.returncode == 0, read.stderr
    # ~ is the remote home the commands start in (a directory named '~' was made there)
    assert config.load("ok", str(tmp_path)).workdir == "runs/here"
    _write(tmp_path, {"remote/broken.yaml": "host: [x\n"})  # a traceback and exit 1 before
    with pytest.raises(ConfigError, match=r"remote broken: .*broken.yaml is not valid YAML \(.*\): fix it"):
        config.load("broken", str(tmp_path))


def test_commands_take_name_colon_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, {"conf/remote/mine.yaml": "host: login\n"})
    monkeypatch.chdir(tmp_path)
    assert commands._remote_args(["--config-dir", "conf", "mine:outputs/r", "--json"]) == (
        "mine", ["outputs/r", "--json"], "conf", [])
    assert commands._remote_args(["other:outputs"]) is None  # not a remote: left to the command
    assert commands._local_path("/w/snapshots/abc/outputs/r/loss.png", "/w") == tmp_path / "outputs/r/loss.png"
    assert commands._local_path("outputs/r/loss.png", "/w") == tmp_path / "outputs/r/loss.png"
    assert commands._local_path("/elsewhere/r/loss.png", "/w") == tmp_path / "r/loss.png"


def test_ssh_shares_a_connection_unless_the_users_config_has_its_own(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMTRAIN_SSH_CONTROL_DIR", str(tmp_path / "cm"))
    plain = tmp_path / "plain"
    plain.write_text("Host login\n  HostName 10.0.0.1\n")
    ours = Connection(RemoteConfig(name="t", host="login", port=2222, jump="bastion", ssh_config=str(plain))).base()
    assert ours[:7] == ["ssh", "-F", str(plain), "-p", "2222", "-J", "bastion"]
    assert f"ControlPath={tmp_path / 'cm' / '%C'}" in ours and ours[-2:] == ["-o", "ControlMaster=no"]
    assert (tmp_path / "cm").stat().st_mode & 0o777 == 0o700
    theirs = tmp_path / "theirs"
    theirs.write_text("Host login\n  ControlMaster auto\n  ControlPath ~/.ssh/cm-%C\n  ControlPersist 1h\n")
    assert not any(o.startswith("ControlPath") for o in Connection(
        RemoteConfig(name="t", host="login", ssh_config=str(theirs))).base())
    # Nothing of the local environment is asked to be sent.
    assert not any("SendEnv" in o or "SetEnv" in o for o in ours)
    # A host that drops packets is given up after a bound (it hung for minutes), unless the user's config says
    assert "ConnectTimeout=30" in ours
    patient = tmp_path / "patient"
    patient.write_text("Host login\n  ConnectTimeout 120\n")
    assert not any(o.startswith("ConnectTimeout") for o in Connection(
        RemoteConfig(name="t", host="login", ssh_config=str(patient))).base())


def test_a_submission_from_a_laptop_prints_commands_the_laptop_can_type(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Its `status:` and `plots:` lines named the login node's absolute paths, which mean nothing on the laptop."""
    from launcher.run.remote.hints import ORIGIN_ENV, follow_command, origin_env

    work = tmp_path / "work dir"
    (work / "outputs" / "sweeps" / "lr").mkdir(parents=True)
    (work / "snapshots" / "abc").mkdir(parents=True)
    (work / "snapshots" / "abc" / "outputs").symlink_to("../../outputs")
    sweep = work / "snapshots" / "abc" / "outputs" / "sweeps" / "lr"  # as the launcher in the snapshot sees it
    monkeypatch.delenv(ORIGIN_ENV, raising=False)
    assert follow_command("launcher.status", sweep) == f"python -m launcher.status '{sweep}'"
    # the laptop's remote.KEY=VALUE overrides too: another workdir or user finds the run where it is
    monkeypatch.setenv(ORIGIN_ENV, origin_env("big", "my conf", ["remote.user=bob"], str(work))[ORIGIN_ENV])
    assert follow_command("launcher.report", sweep) == \
        "python -m launcher.report --config-dir 'my conf' remote.user=bob big:outputs/sweeps/lr"
    monkeypatch.setenv(ORIGIN_ENV, origin_env("big", None, [], str(work))[ORIGIN_ENV])
    assert follow_command("launcher.status", "/elsewhere/run") == "python -m launcher.status big:/elsewhere/run"


def test_a_clean_launch_resuming_a_dirty_ones_run_leaves_no_stale_diff(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The run directory's snapshot.diff was written when there was a diff and left alone when not: a clean launch
    resuming the run kept the dirty one's diff beside environment.json's git_dirty=false."""
    from contract.remote_snapshot import DIFF_FILE, GIT_STATE_ENV, GIT_STATES, git_state_key
    from launcher.compose import compose_config
    from launcher.run import rundir

    dirty = {"commit": "a" * 40, "dirty": True, "diff": "+edit\n"}
    clean = {"commit": "a" * 40, "dirty": False, "diff": ""}
    (tmp_path / ".slurmtrain-snapshot.json").write_text(json.dumps({"format": 1, "id": "0123", "git": dirty}))
    (tmp_path / GIT_STATES).mkdir()
    (tmp_path / GIT_STATES / f"{git_state_key(clean)}.json").write_text(json.dumps(clean))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(GIT_STATE_ENV, raising=False)
    run_dir = tmp_path / "outputs" / "r"
    cfg = compose_config([f"run.root={tmp_path / 'outputs'}", "run.name=r"])
    rundir.prepare(cfg, run_dir, argv=["launcher"])
    assert (run_dir / DIFF_FILE).read_text() == "+edit\n"
    monkeypatch.setenv(GIT_STATE_ENV, git_state_key(clean))
    rundir.prepare(cfg, run_dir, argv=["launcher"])
    assert not (run_dir / DIFF_FILE).exists()
    assert json.loads((run_dir / "environment.json").read_text())["snapshot"]["git_dirty"] is False
