"""The site's generated references (launcher/docs/): every schema key in the config reference with its default and
its comment, every command's flags in the command reference."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

import pytest
from omegaconf import MISSING, OmegaConf

from contract.config.keys import num
from contract.config.schema import Config
from launcher.commands import COMMANDS, build_parser
from launcher.docs import commands_reference, config_reference


def _declared(cls: type, prefix: str = "") -> dict[str, dataclasses.Field]:
    """Every key of the schema, walked here independently of the generator."""
    hints = typing.get_type_hints(cls)
    out: dict[str, dataclasses.Field] = {}
    for f in dataclasses.fields(cls):
        section = next((t for t in (hints[f.name], *typing.get_args(hints[f.name])) if dataclasses.is_dataclass(t)),
                       None)
        if section is not None:
            out.update(_declared(section, f"{prefix}{f.name}."))  # type: ignore[arg-type]
        else:
            out[f"{prefix}{f.name}"] = f
    return out


@pytest.fixture(scope="module")
def rows() -> dict[str, list[str]]:
    """The config reference's table rows: key -> its cells (type, default, range or choices, explanation)."""
    out = {}
    for line in config_reference.render().splitlines():
        if line.startswith("| `") and "." in line.split("|")[1]:
            cells = [c.strip() for c in line.replace("\\|", "\x00").strip("|").split("|")]
            out[cells[0].strip("`")] = [c.replace("\x00", "|") for c in cells[1:]]
    return out


def test_every_key_is_in_the_reference_with_its_default(rows: dict[str, list[str]]) -> None:
    declared = _declared(Config)
    assert len(declared) > 150
    assert set(rows) == set(declared)
    for name, f in declared.items():
        shown = rows[name][1].strip("`")
        if f.default is MISSING or f.default == MISSING:
            assert shown == "required", name
        elif f.default is not dataclasses.MISSING:
            # As YAML would read the cell back (OmegaConf's loader: 1e-05 is a float, null is None).
            assert OmegaConf.create(f"v: {shown}")._get_node("v")._value() == f.default, name
        else:
            assert OmegaConf.to_container(OmegaConf.create(f"v: {shown}"))["v"] == f.default_factory(), name
        assert rows[name][3], f"{name} has no explanation"


def test_ranges_choices_and_comments_come_from_the_schema(rows: dict[str, list[str]]) -> None:
    assert rows["model.dropout"][2] == "`[0, 1)`"
    assert rows["optim.lr"][2] == "`(0, inf)`"
    assert rows["optim.schedule"][2].startswith("`cosine`, `linear`")
    assert "`tiny`" in rows["model.name"][2] and "`llama3_8b`" in rows["model.name"][2]
    assert rows["model.n_kv_heads"][0] == "`int | None`"
    assert rows["model.n_kv_heads"][3].startswith("Grouped-query attention: fewer key/value heads")
    assert rows["model.mlp"][3] == "swiglu | gelu"  # the comment after the key on its line


@dataclass
class _Section:
    # Explained above.
    explained: int = num(1, 0)
    inline: str = "a"  # explained after it
    bare: float = 0.5


def test_a_key_without_a_comment_fails_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = config_reference.schema_keys(_Section)
    assert [(k.name, k.doc) for k in keys] == [("explained", "Explained above."), ("inline", "explained after it"),
                                                ("bare", "")]
    assert config_reference.undocumented(keys) == ["bare"]
    monkeypatch.setattr(config_reference, "schema_keys", lambda: keys)
    with pytest.raises(ValueError, match="config keys without a comment: bare"):
        config_reference.render()


def test_every_command_and_flag_is_in_the_command_reference() -> None:
    page = commands_reference.render()
    for module, _ in COMMANDS:
        assert f"## {module}" in page
        for action in build_parser(module)._actions:
            for flag in action.option_strings:
                assert flag in page, f"{module} {flag}"


def test_the_committed_reference_pages_are_a_fresh_generation() -> None:
    """docs/reference/*.md are committed so that links work in a checkout; a key or flag added without
    regenerating them fails here, with the one command that writes them."""
    from launcher.docs.site import DOCS, PAGES, REGENERATE, stale_pages, stale_words

    stale = stale_pages()
    assert stale == [], stale_words(stale)
    assert REGENERATE == "make reference" and "reference:" in (DOCS.parent / "Makefile").read_text()
    assert all(path in stale_words([path]) and REGENERATE in stale_words([path]) for path in PAGES)


def test_a_stale_page_is_found(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from launcher.docs.site import PAGES, stale_pages

    for path, render in PAGES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(render())
    assert stale_pages(tmp_path) == []
    (tmp_path / "reference/config.md").write_text("# old\n")
    assert stale_pages(tmp_path) == ["docs/reference/config.md"]
