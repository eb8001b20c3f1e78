"""The loader's side of `predictors`: the online tuner and the run history's key and
recorder. Logs as `iolib.tuning`."""
