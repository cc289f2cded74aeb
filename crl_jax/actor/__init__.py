"""The actor (METHOD.md §2 steps 1-3): multi-turn rollouts in token space (`rollout.py`), the guided / free
split and retrieval of one entry per guided rollout (`experience.py`), greedy evaluation with and without
experience (`evaluate.py`).
"""
