"""Errors a user can act on. The CLI prints them as one line; the server maps them to OpenAI error bodies."""

from __future__ import annotations


class UserError(Exception):
    """Bad input or setup: the message names the file or parameter and says what to do."""

    exit_code = 2
    http_status = 400
    error_type = "invalid_request_error"


class SetupError(UserError):
    """Something must be installed or built first."""

    exit_code = 3
    http_status = 503
    error_type = "server_error"
