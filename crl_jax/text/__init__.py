"""Text in token space: tokenizers and chat templates (`tokenizers.py`), segment packing (`packing.py`), the
LLM prompt templates (`prompts/`).
"""
