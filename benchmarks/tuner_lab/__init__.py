"""The research behind the prefetch tuner, kept out of the runtime package.

`predictors` ships what a user runs (the controller, the model loader, the report);
this package holds what measured and chose it: the SYNTHETIC loader simulator
(`synthetic`), model training and grouped cross-validation (`training`), and the
dimensionless features of the transfer experiment (`transfer`). The scenario suites
that use them are the scripts beside it (`benchmarks/scenarios.py`,
`scenario_limits.py`, `model_families.py`); tests that need them carry the `lab` marker.
"""
