"""python -m launcher [overrides]: compose -> validate -> plan -> dispatch (local or SLURM)."""

from __future__ import annotations

import signal
import sys

from contract.errors import EXIT_KILLED

INTERRUPTED = "launcher: interrupted (Ctrl-C); run the same command again (a run resumes from its newest checkpoint)"


def _interrupted_while_importing(signum: int, frame: object) -> None:
    """A Ctrl-C while the imports below run (half a second): the one line, not a traceback through Hydra's imports."""
    print(INTERRUPTED, file=sys.stderr)
    raise SystemExit(EXIT_KILLED)


# Only where Ctrl-C raises KeyboardInterrupt (not where SIGINT is ignored, as for a shell's background job), and only
# when run in the main thread (an import elsewhere can't set handlers).
_default_sigint = signal.getsignal(signal.SIGINT)
_catching = _default_sigint is signal.default_int_handler
try:
    if _catching:
        signal.signal(signal.SIGINT, _interrupted_while_importing)
except ValueError:
    _catching = False

import hydra  # noqa: E402
from hydra.core.hydra_config import HydraConfig  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from omegaconf.errors import InterpolationResolutionError  # noqa: E402

from contract.errors import EXIT_BAD_INPUT, ConfigError, SweepExit  # noqa: E402
from contract.terminal import outlive_terminal  # noqa: E402
from launcher.checks import hydra_errors  # noqa: E402
from launcher.checks.overrides import typed_as  # noqa: E402
from launcher.config_store import register  # noqa: E402
from launcher.run.dispatch import dispatch  # noqa: E402

if _catching:  # from here, KeyboardInterrupt (main() below) or the workers' handling
    signal.signal(signal.SIGINT, _default_sigint)

_composed = False


@hydra.main(config_path="../conf", config_name="config", version_base=None)
def _hydra_main(cfg: DictConfig) -> int:
    global _composed
    _composed = True
    hydra_errors.release()
    # As typed: the overrides' own ${...} stay unresolved here (a bad one is reported below, as the user's).
    typed = OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)
    try:
        with typed_as(typed):  # type: ignore[arg-type]
            code = dispatch(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except InterpolationResolutionError as err:
        print(f"error: {hydra_errors.interpolation(err)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    if code:
        sys.exit(code)
    return 0


def _compose_once() -> None:
    """Hydra composes the whole config a first time only to read `hydra.mode`, which our config never sets, then
    again to run: half of a submission's wait (bench/submit_latency.py). The mode then comes from -m as usual; an
    explicit `hydra.mode=` override keeps Hydra's own way."""
    from hydra._internal.hydra import Hydra

    read_mode = Hydra.get_mode

    def get_mode(self: Hydra, config_name: str | None, overrides: list[str]) -> object:
        if any(o.lstrip("+~").startswith("hydra.mode") for o in overrides):
            return read_mode(self, config_name, overrides)
        return None

    Hydra.get_mode = get_mode  # type: ignore[method-assign]


MULTIRUN_FLAGS = ("-m", "--multirun")


def multirun_first(argv: list[str]) -> list[str]:
    """`-m` (`--multirun`) anywhere on the line, as typed after the overrides: argparse takes Hydra's flags only
    before them (else "unrecognized arguments", a usage over several lines), so it moves to the front."""
    flags = [a for a in argv if a in MULTIRUN_FLAGS]
    return flags + [a for a in argv if a not in MULTIRUN_FLAGS] if flags else argv


def main() -> None:
    sys.argv[1:] = multirun_first(sys.argv[1:])
    if any(arg.startswith(("+remote=", "remote=", "remote.", "+remote.", "++remote.")) for arg in sys.argv[1:]):
        from launcher.run.remote.launch import forward

        code = forward(sys.argv[1:])  # the same command on a cluster's login node (launcher/run/remote/)
        if code is not None:
            sys.exit(code)
    outlive_terminal()  # a closed pipe or terminal (`| head`, a dropped SSH session) neither stops nor fails a run
    register()
    _compose_once()
    hydra_errors.hold()
    try:
        _hydra_main()
    except SystemExit as exit_:
        # Hydra reports a bad override or unknown key itself, over several lines, and exits 1 before our function
        # runs; that is bad input too: one line and our exit code.
        if exit_.code == 1 and not _composed and not isinstance(exit_, SweepExit):
            print(hydra_errors.one_line(hydra_errors.take()), file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        if exit_.code == 2 and not _composed and not isinstance(exit_, SweepExit):  # argparse: usage and its error
            held = hydra_errors.take()
            print(hydra_errors.argparse_problem(held) or held.rstrip(), file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        raise
    except KeyboardInterrupt:  # before the workers took over the signal (composing, planning): a traceback before
        print(INTERRUPTED, file=sys.stderr)
        sys.exit(EXIT_KILLED)
    finally:
        hydra_errors.release()


if __name__ == "__main__":
    main()
