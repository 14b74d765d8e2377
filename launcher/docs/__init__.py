"""The documentation site's generated parts (`make docs`: MkDocs, mkdocs.yml at the repository root).

    mkdocs_hooks.py        the hooks mkdocs.yml names: adds the generated pages and figures to every build
    site.py                what is generated, by the path a page links it with; which committed pages are stale
    references.py          `make reference`: writes the committed reference pages again (--check: only says)
    config_reference.py    reference/config.md: every schema key, its type, default, range, choices and comment
    commands_reference.py  reference/commands.md: every command's --help (launcher/commands.py)
    showcase.py            a tiny local run made by the build: launcher.report's PNGs and launcher.status's table
"""
