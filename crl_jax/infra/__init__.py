"""Host-side infrastructure around the loop: the run driver (`run.py`, `run_folder.py`), the CLI (`cli.py`),
the demo and sweeps (`demo.py`, `sweep.py`), Orbax checkpoints (`checkpoint.py`, `errors.py`), metrics
and plots (`metrics.py`, `plot.py`), meshes and multi-process start-up (`sharding.py`, `distributed.py`).
"""
