"""A bad flag to any command a user types is one `error:` line naming the fix, exit 2: found by trying
`python -m launcher.export RUN --bogus`, which printed argparse's seven-line usage and a
`python -m launcher.export: error: ...` line (so did status and report), while sample, evaluate and prepare
printed one line. Every command's parser is built as the command builds it (launcher/commands.py)."""

from __future__ import annotations

import pytest

from contract.errors import EXIT_BAD_INPUT
from launcher.commands import COMMANDS, build_parser


@pytest.mark.parametrize("module", [name for name, _ in COMMANDS])
@pytest.mark.parametrize("argv", [["--no-such-flag"], ["somewhere", "--no-such-flag"]])
def test_a_bad_flag_is_one_error_line_exit_2(module: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        build_parser(module).parse_args(argv)
    assert stop.value.code == EXIT_BAD_INPUT
    out = capsys.readouterr()
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("error: ") and f"python -m {module} --help" in lines[0], lines[0]
    assert out.out == ""
