"""Environments stepped on the host (real MiniHack, TextWorld, ALFWorld): the adapter wrapper and the renderer
of their observations (`env.py`). The driver that plays them around jit-compiled turns is `crl_jax.host`, a
layer above the loop it drives.
"""
