"""`asp-npu` entry point: a thin, lazy dispatcher over one module per command.

Each command is `asp_npu/cli/<command>.py` exposing `main(argv) -> int`: it parses the flags, checks
them, calls plain library functions and prints. Only the chosen module is imported, so `asp-npu plan`
never pays for torch/vLLM. The arrow points one way: the CLI imports the library, never the reverse
(tests/test_arrows.py keeps it so). Bad input is a `UserError`: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import signal
import sys
from typing import Any

from asp_npu import interrupt
from asp_npu.errors import UserError

# command words -> (module exposing main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("asp_npu.cli.trace", "length traces: `trace synth` makes a synthetic reasoning-RL trace"),
    "predict-eval": (
        "asp_npu.cli.predict_eval",
        "evaluate a response-length predictor on one epoch of a trace",
    ),
    "plan": ("asp_npu.cli.plan", "plan one epoch of a trace with the offline ASP planner"),
    "bench sim": ("asp_npu.cli.bench_sim", "simulate all modes (ASP and baselines) at cluster scale"),
    "bench real": ("asp_npu.cli.bench_real", "run modes side by side with real engines and trainer"),
    "calibrate": ("asp_npu.cli.calibrate", "measure the local vLLM engine for the simulator's cpu preset"),
    "init-model": ("asp_npu.cli.init_model", "build a local tokenizer + random model (no download)"),
    "sft": ("asp_npu.cli.sft", "supervised warm-start on a synthetic task"),
    "export-hf": ("asp_npu.cli.export_hf", "write a trainer checkpoint as a Hugging Face model folder"),
    "train": ("asp_npu.cli.train", "GRPO training with the ASP asynchronous pipeline"),
    "check": ("asp_npu.cli.check", "validate a config against a cluster without touching hardware"),
    "import-config": ("asp_npu.cli.import_config", "translate a MindSpeed-RL or verl GRPO config into ours"),
    "report": ("asp_npu.cli.report", "redraw the one-page report of a run directory"),
    "config-reference": ("asp_npu.cli.config_reference", "every config key, default, range, MindSpeed name"),
}


class CommandParser(argparse.ArgumentParser):
    """argparse that reports bad arguments as one UserError line (exit 2) instead of usage spam."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(message)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """Flags may sit between `key=value` overrides (`train a=1 --overwrite b=2`), as users type them."""
        try:
            return self.parse_intermixed_args(args, namespace)
        except TypeError:  # a parser argparse cannot intermix (REMAINDER, exclusive groups)
            return super().parse_args(args, namespace)


def command_parser(prog: str, description: str = "") -> CommandParser:
    """The parser every command uses: `asp-npu <prog>` in its usage line, errors as UserError."""
    return CommandParser(prog=f"asp-npu {prog}", description=description)


def _usage() -> str:
    width = max(len(k) for k in COMMANDS)
    lines = ["usage: asp-npu <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name = argv[0]
    if len(argv) > 1 and f"{argv[0]} {argv[1]}" in COMMANDS:
        name = f"{argv[0]} {argv[1]}"
    if name not in COMMANDS:
        close = difflib.get_close_matches(argv[0], sorted({k.split()[0] for k in COMMANDS}), n=1)
        if close:
            print(f"asp-npu: error: unknown command '{argv[0]}' (did you mean '{close[0]}'?)",
                  file=sys.stderr)
        else:
            print(f"asp-npu: error: unknown command '{argv[0]}'\n{_usage()}", file=sys.stderr)
        return 2
    rest = argv[len(name.split()):]
    if name in LONG:
        interrupt.install()  # a signal during start-up ends the command and all it started
    try:
        module = importlib.import_module(COMMANDS[name][0])
        return int(module.main(rest) or 0)
    except UserError as exc:
        print(f"asp-npu {name}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, interrupt.Interrupted) else interrupt.received()
        return _interrupted(name, signum or signal.SIGINT)
    except SystemExit as exc:  # Ray's own SIGTERM handler, while ray.init runs, exits with 15
        if name in LONG and exc.code == signal.SIGTERM:
            return _interrupted(name, signal.SIGTERM)
        raise


LONG = ("train", "bench real", "calibrate", "sft")  # commands that start engines, Ray or process groups


def _interrupted(name: str, signum: int) -> int:
    """One line, every process the command started ended, exit 128 + signal (143 SIGTERM, 130 SIGINT)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)  # the clean-up below is bounded; SIGKILL still works
    ended = interrupt.end_children() if name in LONG else 0
    what = f"; ended {ended} process(es) it started" if ended else ""
    print(f"asp-npu {name}: interrupted by {signal.Signals(signum).name}{what}", file=sys.stderr)
    return 128 + int(signum)

