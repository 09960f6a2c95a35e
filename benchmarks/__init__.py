"""Speed benchmarks (figures, not pass/fail tests): engine vs plain loop vs Lightning, MFU, overhead, scaling."""
