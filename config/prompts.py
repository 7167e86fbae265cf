"""The operator's yes/no at a command's prompt, as every command of the product asks it."""
from __future__ import annotations

import sys

from django.core.management.base import CommandError


def confirmed(question: str, *, yes: bool, as_json: bool, stderr) -> bool:
    """True when `--yes` was given or the operator answers y/yes to `question`. No answer (no
    terminal and nothing piped in: a script, cron) is a no, said on `stderr`; with --json and
    no terminal the command cannot ask at all and stops naming --yes."""
    if yes:
        return True
    if not sys.stdin.isatty() and as_json:
        raise CommandError("--json without --yes needs a terminal to confirm")
    try:
        answer = input(f"{question} (y/n): ").strip().lower()
    except EOFError:
        stderr.write("\nno answer: standard input is closed; add --yes to confirm without a terminal")
        return False
    return answer in ("y", "yes")
