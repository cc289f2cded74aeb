"""Every file of experiments/configs loads: a sweep file (it names seeds, a grid or points) expands into members
whose configs validate, any other file is a config that `load` accepts. The docs give each as a command to run."""

import os

import pytest
import yaml

from crl_jax.config import load
from crl_jax.infra.sweep_spec import expand, load_spec

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments",
                       "configs")
FILES = sorted(f for f in os.listdir(CONFIGS) if f.endswith(".yaml"))


def test_the_folder_holds_configs():
    assert {"default.yaml", "families.yaml", "families_confirm.yaml"} <= set(FILES)


@pytest.mark.parametrize("name", FILES)
def test_each_experiment_config_loads(name, tmp_path):
    path = os.path.join(CONFIGS, name)
    with open(path, encoding="utf-8") as f:
        d = yaml.safe_load(f) or {}
    if {"seeds", "grid", "points"} & set(d):
        members = expand(load_spec(path), str(tmp_path))
        assert members and len({m.run_dir for m in members}) == len(members)
    else:
        load(path, [])


def test_the_coevolve_demo_preset_is_the_confirm_sweeps_config(tmp_path):
    """`crl-jax demo --preset coevolve` runs the embedded default, which is the options that
    return_counterfactual_confirm.yaml checked on fresh seeds (its ret_cf16 point), with the frozen-extractor, GRPO
    and archive controls; that file's base, like op_weight_confirm.yaml's, is coevolve_rel_confirm.yaml's crl_ent
    (the default before it)."""
    import dataclasses

    from crl_jax.infra.demo import preset

    def point_of(name, point):  # the config the sweep runs for `point`, at the embedded default's seed
        member = next(m for m in expand(load_spec(os.path.join(CONFIGS, name)), str(tmp_path)) if m.point == point)
        return dataclasses.replace(member.cfg, seed=0)

    ov, methods, seeds = preset("coevolve")
    assert ov == () and load(None) == point_of("return_counterfactual_confirm.yaml", "ret_cf16")
    assert point_of("return_counterfactual_confirm.yaml", "crl") == point_of("coevolve_rel_confirm.yaml", "crl_ent")
    assert point_of("op_weight_confirm.yaml", "crl") == point_of("coevolve_rel_confirm.yaml", "crl_ent")
    assert methods == ("crl", "static_online", "grpo", "archive") and seeds == 3


def test_the_paper_rules_are_the_tiny_defaults_departures_and_an_llms_defaults():
    """paper_rules.yaml and `crl-jax demo --preset paper` differ from the embedded default in exactly the write
    rules of crl_jax/config_rules.py; an LLM extractor gets those values unless its config sets them."""
    import dataclasses

    from crl_jax.config_rules import PAPER_EXTRACTION, paper_overrides
    from crl_jax.infra.demo import preset

    paper = load(os.path.join(CONFIGS, "paper_rules.yaml"))
    assert paper == load(None, list(paper_overrides())) == load(None, list(preset("paper")[0]))
    assert preset("paper")[1:] == (("crl", "grpo"), 5)
    tiny, ours = dataclasses.asdict(paper.extraction), dataclasses.asdict(load(None).extraction)
    assert {k for k in tiny if tiny[k] != ours[k]} == set(PAPER_EXTRACTION)
    assert {k: tiny[k] for k in PAPER_EXTRACTION} == PAPER_EXTRACTION
    llm = ["actor.preset=smollm2-135m", "extractor.preset=smollm2-135m"]
    ext = dataclasses.asdict(load(None, llm).extraction)
    assert {k: ext[k] for k in PAPER_EXTRACTION} == PAPER_EXTRACTION
    assert load(None, llm + ["extraction.batch=4", "extraction.return_samples=2"]).extraction.batch == 4
    assert load(None, llm + ["extraction.return_samples=2"]).extraction.return_samples == 2
    assert load(None, ["actor.preset=smollm2-135m"]).extraction == load(None).extraction  # the extractor decides


@pytest.mark.parametrize("name, differs", [("families.yaml", {}), ("forms_room.yaml", {}), ("minihack_real.yaml", {}),
                                           ("outcome_last_opw.yaml", {"outcome_last": True})])
def test_configs_measured_under_the_papers_rules_set_them(name, differs):
    """The configs that pin the paper's write rules (their results were measured under them) hold
    crl_jax/config_rules.py's values, but for what the file is about."""
    from crl_jax.config_rules import PAPER_EXTRACTION

    ext = load(os.path.join(CONFIGS, name)).extraction
    assert {k: getattr(ext, k) for k in PAPER_EXTRACTION} == {**PAPER_EXTRACTION, **differs}
