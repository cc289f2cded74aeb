"""The paper's write rules for the extractor, as `extraction.*` values.

The tiny extractor's defaults depart from them (`crl_jax/config.py`, docs/METHOD.md §3): measured on the embedded
default, an extractor trained by the paper's rules does not learn what to write. An LLM extractor keeps the paper's
rules as its defaults (nothing is measured on that path yet), and `crl-jax demo --preset paper` runs them on the
tiny models.
"""

from __future__ import annotations

PAPER_EXTRACTION = {
    "reward": "outcome",  # +1 / -1 per use of the entry by a guided rollout
    "baseline": "batch_mean",  # advantage r - the batch's mean reward
    "return_samples": 0,  # only writes are trained (no-write decisions never are)
    "return_counterfactual": False,  # (no-write samples, were there any, only where the extractor drew RETURN)
    "outcome_last": False,  # the outcome right before the answer label in the distillation prompt
    "op_entropy": 0.0,  # no entropy bonus on the write decision
    "batch": 8,  # samples per extractor update
    "buffer_capacity": 256,  # sample buffer size
}


def paper_overrides() -> tuple[str, ...]:
    """PAPER_EXTRACTION as dotted command-line overrides."""
    return tuple(f"extraction.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in PAPER_EXTRACTION.items())


def with_extractor_defaults(data: dict) -> dict:
    """`data` (a config mapping) with PAPER_EXTRACTION beneath its own `extraction` values when its extractor is an
    LLM (`extractor.preset` other than tiny): the dataclass defaults are the tiny extractor's."""
    if not isinstance(data, dict):  # _build names the bad value
        return data
    ext_model = data.get("extractor") if isinstance(data.get("extractor"), dict) else {}
    if ext_model.get("preset", "tiny") == "tiny":
        return data
    extraction = data.get("extraction", {})
    if not isinstance(extraction, dict):  # _build names the bad value
        return data
    return {**data, "extraction": {**PAPER_EXTRACTION, **extraction}}
