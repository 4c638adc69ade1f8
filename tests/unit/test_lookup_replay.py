"""The lookup replayed on an answer that quotes its prompt (benchmarks.realpair.lookup_replay)."""

from __future__ import annotations

from benchmarks.realpair.lookup_replay import replay
from vllm_specextend.drafting import lookup

PASSAGE = list(range(300, 320))  # 20 tokens the answer quotes
PROMPT = list(range(10, 60)) + PASSAGE + list(range(100, 140))


def test_an_answer_quoting_its_prompt_is_looked_up_after_the_drafts():
    # Step 1: bonus PASSAGE[0], drafts [1:4] (taken as right), the lookup's 9
    # follow its match in the prompt: [4:13], all right. Step 2: bonus [13],
    # drafts [14:17], then [17:20] right before the answer ends.
    assert replay(PROMPT, PASSAGE, drafted=3, looked_up=9, min_match=3, longest=8) == (2, 12)
    assert replay(PROMPT, PASSAGE, drafted=3, looked_up=9, min_match=3, longest=16) == (2, 12)
    assert lookup.LOOKUP_LONGEST == 8, "the module's rule is restored"


def test_a_proposal_is_accepted_up_to_its_first_difference():
    # The answer edits the quote's 8th token. Step 1 looks up [4:13] and holds
    # [4:7] only (counting every equal token would take 8); step 2's bonus is
    # the edit, its drafts [8:11] re-sync the key with the prompt and the
    # lookup's 9 ([11:20]) hold.
    answer = PASSAGE[:7] + [999] + PASSAGE[8:]
    assert replay(PROMPT, answer[:8], drafted=3, looked_up=9, min_match=3,
                  longest=8) == (1, 3)
    assert replay(PROMPT, answer, drafted=3, looked_up=9, min_match=3, longest=8) == (2, 12)


def test_an_answer_the_prompt_does_not_hold_gets_nothing_looked_up():
    answer = list(range(500, 540))
    steps, accepted = replay(PROMPT, answer, drafted=3, looked_up=9, min_match=3,
                             longest=8)
    assert (steps, accepted) == (10, 0)  # bonus tokens at 0, 4, .., 36: 4 tokens a step


def test_a_longer_shortest_match_takes_fewer():
    # The answer departs from the quote at its 3rd token: with min_match 1 the
    # lookup still finds short keys in the prompt, with 4 it finds none until
    # a 4-token run of the quote is back in the key.
    answer = PASSAGE[:2] + [999] + PASSAGE[3:]
    loose = replay(PROMPT, answer, drafted=1, looked_up=4, min_match=1, longest=8)
    strict = replay(PROMPT, answer, drafted=1, looked_up=4, min_match=4, longest=8)
    assert loose[1] > strict[1]
