"""What differs between paths, behind one protocol (`base.py`: `Backend`): the built-in JAX environments with
the tiny models (`builtin.py`), pretrained LLMs (`llm/`), environments stepped on the host (`host/`).
The iteration itself is `crl_jax.loop`'s, once for all of them.
"""
