"""Errors a person can act on, and how they reach them.

Exit codes, the same for every command: 2 = the input is wrong (a file, an option: fix the command line),
1 = running failed although the input looked right (llama.cpp refused a file, a missing build or package,
an unexpected error). The CLI prints each as one line `error: <file or option>: <what is wrong>; <what to
do>` (a traceback only with --debug); the server maps them to OpenAI error bodies.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input: the message names the file or parameter and says what to do."""

    exit_code = 2
    http_status = 400
    error_type = "invalid_request_error"


def refuse_first(checks) -> None:
    """Validation as a table of rows (ok, option, value, rule): the first row not ok is one UserError line
    "option value: rule" ("option: rule" where value is None)."""
    for ok, option, value, rule in checks:
        if not ok:
            raise UserError(f"{option}{'' if value is None else f' {value}'}: {rule}")


class RunFailure(UserError):
    """The input passed every check, but running it failed (e.g. llama.cpp refused to load a model)."""

    exit_code = 1
    http_status = 500
    error_type = "server_error"


class SetupError(RunFailure):
    """Something must be installed or built first: nothing is wrong with the command line, so exit 1."""

    http_status = 503
