"""Exceptions of the predictors package: each message carries the value, the rule and the fix.

Why a module of their own: `predictors` never imports `iolib`, so it cannot reuse
`iolib.errors`. Every class subclasses `ValueError`, so the CLI can catch them as bad
input (the loader-side integration may re-raise them as `iolib.errors.ConfigError`).
"""

from __future__ import annotations


class PredictorError(ValueError):
    """Base class of every error `predictors` raises on purpose."""


class SchemaError(PredictorError):
    """An observations table does not follow the schema: the message names the columns."""


class LeakageError(PredictorError):
    """An outcome (or something derived from one) was about to become a model input."""


class ModelVersionError(PredictorError):
    """A saved model was trained for another schema version, or its sidecar is unreadable."""


class TunerConfigError(PredictorError):
    """A tuner argument breaks a rule (target outside (0, 1), budget below one batch, ...)."""
