"""predictors: the learned model behind iolib's prefetch tuner.

Imports nothing from `iolib` and works on plain numbers. Names load lazily, so
importing the package does no work (matplotlib loads on first use). Training,
the simulator and the scenarios are research and live in `benchmarks/tuner_lab/`.
See predictors/README.md for a map of the modules.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "Decision": "predictors.state",
    "HillClimbTuner": "predictors.baselines",
    "LearnedTuner": "predictors.tuner",
    "OracleTuner": "predictors.baselines",
    "Predictor": "predictors.model",
    "QueueingModel": "predictors.baselines",
    "RunHistory": "predictors.history",
    "RunRecord": "predictors.history",
    "SCHEMA_VERSION": "predictors.features",
    "StaticDefaultTuner": "predictors.baselines",
    "Tuner": "predictors.state",
    "TunerConfig": "predictors.config",
    "TunerState": "predictors.state",
    "load": "predictors.model",
    "load_default": "predictors.model",
    "validate_observations": "predictors.features",
    "WorkloadKey": "predictors.history",
    "write_report": "predictors.report",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'predictors' has no attribute {name!r}")
