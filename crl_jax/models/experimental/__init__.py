"""Experimental: code that is tested on the CPU but has never been timed on the hardware it is for.

- `fused_decode.py`: a batch-1 decode step as three Pallas (Triton) kernels per layer
  (`SamplerConfig.decode_kernel="pallas"`, opt-in).
- `fused_sample.py`: the token's draw in a kernel, and the decode loop made of nothing but kernels.

Both are tested equal to XLA's step in Pallas' interpreter and compile for an H200
(`experiments/bench/gpu_aot.py`), but no GPU has run them; `experiments/bench/gpu.sh` times them on one.
They leave this package once a GPU measurement shows they pay (docs/PERFORMANCE.md).
"""
