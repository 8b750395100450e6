"""The control layer: the coordinator, which runs in the launcher's process.

It takes the workers' reports, asks the predictor and the time-model fit for each worker's
speed, lets the sync mode's policy choose the next split, sends it, and records the metrics.

Rule (import-linter): imports core, modes and predictors; never worker/ or MXNet.
"""
