"""--include / --exclude: which files found under an input directory (or a glob's fixed directory) are chosen.

Globs as in .gitignore (pathspec's GitIgnoreSpec), matched on the path under that directory: `*.py` matches at
any depth, `src/*.py` only in src/, `**` any number of directories, `docs/` everything under a directory docs.
A file is chosen when it matches an --include (or none is given) and no --exclude. Files named one by one are
never filtered: naming a file chooses it. As in .gitignore, the order of the patterns matters only where one is
negated (`!pattern`): without one, canonical() sorts them (and drops repeats), so that the same filters given in
another order are the same preparation.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from contract.errors import ConfigError


@dataclass(frozen=True)
class Filters:
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for flag, patterns in (("--include", self.include), ("--exclude", self.exclude)):
            for pattern in patterns:
                _spec(flag, [pattern])  # each refused on its own, so that the error names it

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)

    @cached_property
    def _specs(self) -> tuple[Any, Any]:
        return _spec("--include", self.include), _spec("--exclude", self.exclude)

    def chooses(self, relative: str) -> bool:
        """`relative`: the file's path under its input directory, '/'-separated."""
        include, exclude = self._specs
        return (not self.include or include.match_file(relative)) and not exclude.match_file(relative)

    def describe(self) -> str:
        """The filters as they were given on the command line."""
        import shlex

        given = [f"--include {shlex.quote(p)}" for p in self.include]
        given += [f"--exclude {shlex.quote(p)}" for p in self.exclude]
        return " ".join(given)


def canonical(patterns: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The patterns in an order-free form where order cannot matter (no negated `!` pattern among them)."""
    if any(p.startswith("!") for p in patterns):
        return tuple(patterns)
    return tuple(sorted(set(patterns)))


def _spec(flag: str, patterns: tuple[str, ...] | list[str]) -> Any:
    import pathspec

    for pattern in patterns:
        if not pattern.strip() or pattern.startswith("#"):
            raise ConfigError(
                f"{flag} {pattern!r} matches nothing (a blank or a '#' comment, as in .gitignore): give a "
                f"glob such as '*.py' or 'src/**' (a leading # as '\\#')"
            )
    try:
        return pathspec.GitIgnoreSpec.from_lines(patterns)
    except ValueError as err:
        raise ConfigError(
            f"{flag} {patterns[-1]!r} is not a glob ({err}): give a .gitignore-style pattern such as '*.py' "
            f"or 'src/**/*.txt'"
        ) from None
