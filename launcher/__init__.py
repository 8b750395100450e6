"""The `mxlbbsp` command line (click): launch, predict, report, trace."""
