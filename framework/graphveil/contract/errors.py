"""Errors a user can act on. The CLI prints them on one line and exits with code 2."""


class GraphVeilError(Exception):
    """Base class: bad input or a refused run. Its message names the problem."""


class ConfigError(GraphVeilError):
    """A configuration file or override is invalid (names the file, field and value)."""


class DataError(GraphVeilError):
    """A graph file is malformed or inconsistent (names the file and the offending record)."""


class PluginError(GraphVeilError):
    """A plugin is broken or clashes with another one (names both plugins)."""


class PrivacyError(GraphVeilError):
    """A privacy request cannot be honoured: bad (ε, δ), infeasible budget, mismatched pieces."""


class ProfileMismatchError(PrivacyError):
    """The accountant cannot analyse what the sampler and clipper declare they do."""
