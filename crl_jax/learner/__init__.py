"""The learners (METHOD.md §2 step 6-7, §6): train states and the single jit co-update (`train_state.py`), the
loss callbacks of both paths (`loss_fns.py`), the split-GRPO actor batch and the CISPO extractor batch
(`batches.py`), the tiny models' supervised prior (`pretrain.py`).
"""
