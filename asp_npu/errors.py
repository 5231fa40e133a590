"""User-facing errors: one clear line, exit code 2, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (file, config, argument). The CLI prints `asp-npu <cmd>: error: <msg>` and exits 2."""


class ConfigError(UserError):
    """A configuration value is invalid; raised before any actor or process group starts."""


class InvalidValue(UserError, ValueError):
    """A number out of its range (NaN and inf included): a UserError for the CLI (exit 2), and still
    a ValueError for library callers that construct configs directly."""
