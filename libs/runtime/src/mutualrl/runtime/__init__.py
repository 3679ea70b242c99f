"""Running an experiment: warm start, prompt distribution, evaluation, outputs, the embedded loop."""
