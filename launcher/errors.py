"""The launcher's error for bad input: a leaf module, imported by config and hostfile alike."""


class ConfigError(ValueError):
    """Bad input to the launcher: reported as one line, exit code 2."""
