"""The command-line parser every tool in tools/ uses: argparse with one-line errors.

argparse prints its usage block and then the error; on a misspelt option it names the option
but not the one meant. Here an error is one line on stderr, exit code 2, with the closest option
or choice suggested ("did you mean"), and ``--help`` named for the rest.
"""
import argparse
import difflib
import re
import sys
from typing import Iterable, Optional

_CHOICE = re.compile(r"invalid choice: '(?P<value>[^']*)' \(choose from (?P<choices>.*)\)")


def closest(word: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to ``word`` (difflib ratio >= 0.6), or None."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line with a "did you mean"."""

    def error(self, message: str):
        if message.startswith('unrecognized arguments:'):
            options = [o for o in self._option_string_actions if o.startswith('--')]
            hints = []
            for token in message.split(':', 1)[1].split():
                if token.startswith('-'):
                    match = closest(token.split('=', 1)[0], options)
                    if match:
                        hints.append(f'{token} -> {match}')
            if hints:
                message += f' (did you mean: {", ".join(hints)}?)'
        choice = _CHOICE.search(message)
        if choice:
            match = closest(choice['value'], re.findall(r"'([^']*)'", choice['choices']))
            if match:
                message += f' (did you mean {match!r}?)'
        sys.stderr.write(f'{self.prog}: error: {message}; see --help\n')
        sys.exit(2)
