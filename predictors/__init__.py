"""predictors: the controller behind iolib's prefetch tuner.

Imports nothing from `iolib` and works on plain numbers. Names load lazily, so
importing the package does no work (pandas and matplotlib load only for reports).
The cross-workload model, its training, the simulator and the scenarios are research
and live in `benchmarks/tuner_lab/`.
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
    "QueueingModel": "predictors.baselines",
    "RunHistory": "predictors.history",
    "RunRecord": "predictors.history",
    "QueueingTuner": "predictors.tuner",
    "SCHEMA_VERSION": "predictors.observations",
    "StaticDefaultTuner": "predictors.baselines",
    "Tuner": "predictors.state",
    "TunerConfig": "predictors.config",
    "TunerConstants": "predictors.config",
    "TunerState": "predictors.state",
    "WorkloadKey": "predictors.history",
    "validate_observations": "predictors.observations",
    "write_report": "predictors.report",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'predictors' has no attribute {name!r}")
