"""A remote's config as typed (launcher/run/remote/config.py): YAML's non-strings in setup/exclude, and every way a
remote's key or name can be misspelt gets the one it most likely means."""

from __future__ import annotations

from pathlib import Path

import pytest

from contract.errors import ConfigError
from launcher.run.remote import commands, config


def _remote(tmp_path: Path, text: str = "host: h\n") -> str:
    (tmp_path / "remote").mkdir(exist_ok=True)
    (tmp_path / "remote" / "mine.yaml").write_text(text)
    return str(tmp_path)


def test_setup_lines_yaml_reads_as_booleans_or_numbers_are_refused(tmp_path: Path) -> None:
    """`setup: [false]` ran the command `False` (YAML's boolean, turned into a word by OmegaConf)."""
    conf = _remote(tmp_path, "host: h\nsetup: [false]\n")
    with pytest.raises(ConfigError, match=r"remote mine: setup\[0\] \(.*mine.yaml\) is read as bool false, not a "
                                          r"string: quote it \('false'\)"):
        config.load("mine", conf)
    conf = _remote(tmp_path, "host: h\nsetup: ['module load x', yes]\n")
    with pytest.raises(ConfigError, match=r"setup\[1\] .* is read as bool true, not a string: quote it \('yes'\)"):
        config.load("mine", conf)
    conf = _remote(tmp_path, "host: h\nexclude: ['data', 2024]\n")
    with pytest.raises(ConfigError, match=r"exclude\[1\] .* is read as int 2024, not a string: quote it \('2024'\)"):
        config.load("mine", conf)
    conf = _remote(tmp_path)
    with pytest.raises(ConfigError, match=r"setup\[0\] \(on the command line\) is read as bool false"):
        config.load("mine", conf, ["remote.setup=[false]"])
    # quoted, they are the text typed
    conf = _remote(tmp_path, "host: h\nsetup: ['false', 'true']\n")
    assert config.load("mine", conf).setup == ["false", "true"]


def test_a_misspelt_remote_key_or_name_says_what_it_means(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = _remote(tmp_path)
    # +remote.KEY=VALUE (Hydra's way to add a key) went through to the login node unread, a misspelling with it
    args = config.split_args(["+remote=mine", "+remote.hots=x", "++remote.user=bob", "model=tiny"])
    assert args is not None and args.overrides == ["remote.hots=x", "remote.user=bob"] and args.rest == ["model=tiny"]
    with pytest.raises(ConfigError, match=r"no key 'hots' \(remote.hots=...\): did you mean host\?"):
        config.load("mine", conf, args.overrides)
    assert config.load("mine", conf, ["remote.user=bob"]).user == "bob"
    # a key without a value was said to be in the YAML file
    with pytest.raises(ConfigError, match=r"no key 'hots' \(remote.hots=...\): did you mean host\?"):
        config.load("mine", conf, ["remote.hots"])
    # the remote's own name
    with pytest.raises(ConfigError, match=r"no remote named 'mien' in .*: did you mean \+remote=mine\?"):
        config.load("mien", conf)
    # the results commands take +remote.KEY=VALUE too
    monkeypatch.chdir(tmp_path)
    assert commands._remote_args(["+remote=mine", "+remote.hots=x", "outputs"]) == (
        "mine", ["outputs"], None, ["remote.hots=x"])
