"""The worker layer: what runs inside the user's training script.

The session (the worker's connection to the coordinator), the variable-batch DataLoader, the
Trainer (exact sums over the split, BatchNorm statistics, learning-rate rules), the worker's
half of checkpoints, mxlbbsp.log's scalars and the bundled data sets.

Rule (import-linter): imports core and modes (a mode's worker half); the only layer of the
package, with models/, that imports MXNet. Nothing below it imports it.
"""
