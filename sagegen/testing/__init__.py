"""Test and demo support that needs no model weights: synthetic run directories (`run_dirs`), tiny
random-weight stand-ins for the metric networks (`metric_standins`) and video-like attention inputs
(`attention_inputs`). Scores computed on them mean nothing."""
