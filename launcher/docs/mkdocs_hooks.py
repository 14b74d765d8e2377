"""MkDocs hooks (mkdocs.yml `hooks:`): the generated parts of the site.

    reference/config.md     every config key (launcher/docs/config_reference.py)
    reference/commands.md   every command's --help (launcher/docs/commands_reference.py)
                            both committed under docs/; the build fails while they differ from a fresh generation
                            (`make reference` writes them: launcher/docs/references.py)
    generated/loss.png, generated/tokens_per_s.png   launcher.report's figures of a tiny run the build makes
                            (launcher/docs/showcase.py)
    <!-- generated: status -->   a line of its own in a page: replaced by launcher.status's table of that run

launcher/docs/site.py names them. A page embeds the figures as images (`![loss](generated/loss.png)` from a page
at the top of docs/); the build fails when the showcase run fails, or when no page embeds the status table.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# MkDocs loads this file by its path: make our packages importable whatever directory `mkdocs` runs in.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from launcher.docs.showcase import Showcase, ShowcaseFailed, make_showcase  # noqa: E402
from launcher.docs.site import SHOWCASE_DIR, STATUS_MARKER, stale_pages, stale_words  # noqa: E402

_state: dict[str, Any] = {}


def on_files(files: Files, config: MkDocsConfig) -> Files:
    stale = stale_pages()
    if stale:
        raise PluginError(stale_words(stale))
    try:
        showcase = make_showcase()
    except ShowcaseFailed as err:
        raise PluginError(str(err)) from err
    for name, data in showcase.pngs.items():
        files.append(File.generated(config, f"{SHOWCASE_DIR}/{name}", content=data))
    _state.update(showcase=showcase, status_shown=False)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if STATUS_MARKER not in markdown:
        return markdown
    showcase: Showcase = _state["showcase"]
    _state["status_shown"] = True
    block = f"```text\n$ python -m launcher.status outputs\n{showcase.status}\n```"
    return "\n".join(block if line.strip() == STATUS_MARKER else line for line in markdown.splitlines())


def on_post_build(config: MkDocsConfig) -> None:
    if not _state.get("status_shown"):
        raise PluginError(f"no page embeds the showcase run's status table: put a line `{STATUS_MARKER}` in "
                          "docs/telemetry.md (launcher/docs/mkdocs_hooks.py)")
