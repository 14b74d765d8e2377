"""The site build's generated parts (launcher/docs/mkdocs_hooks.py): the status table replaces its marker, a build
whose pages show no status table fails, and a showcase run that fails stops the build with its command's error."""

from __future__ import annotations

import pytest

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e .[docs]")

from mkdocs.exceptions import PluginError  # noqa: E402

from launcher.docs import mkdocs_hooks, showcase  # noqa: E402
from launcher.docs.site import STATUS_MARKER  # noqa: E402


def test_the_status_marker_becomes_the_showcase_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mkdocs_hooks, "_state", {"showcase": showcase.Showcase({}, "run  state\ntiny finished")})
    page = f"# Telemetry\n\n{STATUS_MARKER}\n\nAfter.\n"
    out = mkdocs_hooks.on_page_markdown(page, None, None, None)  # type: ignore[arg-type]
    assert out == ("# Telemetry\n\n```text\n$ python -m launcher.status outputs\nrun  state\ntiny finished\n```\n\n"
                   "After.")
    mkdocs_hooks.on_post_build(None)  # type: ignore[arg-type]


def test_a_build_without_the_status_table_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mkdocs_hooks, "_state", {"showcase": showcase.Showcase({}, ""), "status_shown": False})
    mkdocs_hooks.on_page_markdown("# Telemetry\n", None, None, None)  # type: ignore[arg-type]
    with pytest.raises(PluginError, match="no page embeds the showcase run's status table"):
        mkdocs_hooks.on_post_build(None)  # type: ignore[arg-type]


def test_a_failed_showcase_run_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(showcase, "RUN", ["trainer.max_steps=0"])
    with pytest.raises(showcase.ShowcaseFailed, match=r"`.* -m launcher trainer.max_steps=0` exited 2:\n.*error: "):
        showcase.make_showcase()


def test_a_stale_reference_page_fails_the_build_naming_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mkdocs_hooks, "stale_pages", lambda: ["docs/reference/config.md"])
    with pytest.raises(PluginError, match=r"docs/reference/config.md differ from a fresh generation .*`make reference`"):
        mkdocs_hooks.on_files(None, None)  # type: ignore[arg-type]
