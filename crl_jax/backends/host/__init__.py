"""Environments stepped on the host (real MiniHack) around jit-compiled turns: the driver (`driver.py`), its
jitted pieces (`play.py`), its evaluation pool (`evaluate.py`), the adapter wrapper (`env.py`).
"""
