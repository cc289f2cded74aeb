"""Reading an LLM reply's action on host games (`crl_jax.host.llm_play.parse_reply`): literal replies
against literal action sets (TextWorld / ALFWorld admissible commands, MiniHack's compass moves)."""

from crl_jax.host.llm_play import parse_command, parse_reply
from crl_jax.envs.adapters.common import DIR_NAMES

TW = ("examine chest drawer", "go east", "inventory", "open chest drawer", "take old key from chest drawer")
ALF = ("go to bed 1", "go to desk 1", "help", "take pillow 1 from bed 1")


def test_prefilled_reply_is_the_command_up_to_the_closing_tag():
    assert parse_command("open chest drawer</answer>", TW, "<answer>") == 3
    assert parse_command("  Go  East.</answer>", TW, "<answer>") == 1  # case, spaces, a full stop
    assert parse_command("take pillow 1 from bed 1\nbecause I can", ALF, "<answer>") == 3  # line end
    assert parse_command("go to desk 1", ALF, "<answer>") == 1  # cut by the token budget, no tag
    # a prefix of a command, another game's command and chatter are no move
    assert parse_command("open chest</answer>", TW, "<answer>") == -1
    assert parse_command("go to desk 2</answer>", ALF, "<answer>") == -1
    assert parse_command("I think I should look around", TW, "<answer>") == -1


def test_the_answer_tag_rule_with_and_without_prefill():
    assert parse_command("Let me see. <answer>inventory</answer>", TW, "") == 2
    assert parse_command("<answer>open chest drawer</answer>", TW, "<answer>") == 3  # the model repeats the tag
    assert parse_command("open chest drawer", TW, "") == -1  # no prefill: the tag is required
    assert parse_command("<answer>dance</answer>", TW, "") == -1


def test_parse_reply_fixed_moves_use_the_llm_paths_rule():
    assert parse_reply("northeast</answer>", DIR_NAMES, fixed=True, prefill="<answer>") == 4
    assert parse_reply("north</answer>", DIR_NAMES, fixed=True, prefill="<answer>") == 0
    assert parse_reply("<answer>west</answer>", DIR_NAMES, fixed=True, prefill="") == 3
    assert parse_reply("northwards", DIR_NAMES, fixed=True, prefill="<answer>") == -1
    assert parse_reply("go east</answer>", TW, fixed=False, prefill="<answer>") == 1


def test_a_long_text_view_keeps_its_command_list():
    from crl_jax.backends.host.env import HostRenderer
    from crl_jax.envs.actions import tiny_tokenizer

    tok = tiny_tokenizer(())  # one token per byte
    r = HostRenderer(tokenizer=tok, max_len=40)
    text = "A long room description. " * 4 + "\nActions: go east | look"
    ids, n = r(text)
    assert int(n) == 40 and r.truncated == 1
    assert tok.decode([int(x) for x in ids[:n]]) == text[:16] + "\nActions: go east | look"
    ids, n = r("x" * 50 + "\nLegend: @: you")  # another last line: the end is cut
    assert tok.decode([int(x) for x in ids[:n]]) == "x" * 40
    ids, n = r("short\nActions: look")
    assert tok.decode([int(x) for x in ids[:n]]) == "short\nActions: look" and r.truncated == 2
