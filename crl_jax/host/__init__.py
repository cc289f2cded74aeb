"""The host driver: a second driver of the loop for environments stepped on the host (`backends/host/env.py`)
around jit-compiled turns, for tiny models and LLMs: the driver (`driver.py`), its jitted pieces (`play.py`,
`llm_play.py` for an LLM's chat turns), its evaluation pool (`evaluate.py`).
"""
