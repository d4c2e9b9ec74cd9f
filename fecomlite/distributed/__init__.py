"""Distributed jobs: ranks launched by torchrun, several GPUs, several nodes.

`identity` (in the probe: which rank this process is), `launch` (`fecomlite run
--nproc-per-node`, or a launcher named by the user), `devices` (each GPU's energy to the calls of
the processes on it), `ranks` (per-rank figures for the report), `merge` (one store of a job
recorded on several nodes). docs/distributed.md tells the user's side.
"""
