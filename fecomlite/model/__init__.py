"""The energy model: predict what training a network costs from its size, compute and the memory
hierarchy (BUTTER-E), fitted on sweeps of small networks measured on this machine.

features (FLOPs, bytes, working sets) · cache (this machine's levels) · network (configurations
and model summaries) · fit (least squares) · predict (with intervals) · sweep (the measured grid)
· fc_program (what a sweep trains) · command (the CLI).
"""
