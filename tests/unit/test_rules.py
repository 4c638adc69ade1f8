"""Drafting rules scored on a forecast (benchmarks.realpair.rules) and the
forecast itself (benchmarks.realpair.forecast)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.realpair.forecast import forecast
from benchmarks.realpair.rules import parse_rule, score

PASSAGE = list(range(300, 330))  # 30 tokens the answer quotes
PROMPT = list(range(10, 60)) + PASSAGE + list(range(100, 140))


def test_a_draft_that_knows_the_answer_fills_every_step():
    # 30 answer tokens: the prompt's sample, then steps of 1 + 4 accepted.
    steps, held, _ = score(PROMPT, PASSAGE, PASSAGE, 4, parse_rule("draft", 4))
    assert (steps, held) == (6, 24)  # bonus tokens at 0, 5, .., 25; 4 at the end


def test_the_plugins_rule_looks_up_after_the_drafts():
    # Step 1: bonus [0], drafts [1:4] right, the lookup's 8 from the prompt
    # [4:12]; step 2: bonus [12], [13:24]; step 3: bonus [24], [25:30].
    steps, held, _ = score(PROMPT, PASSAGE, PASSAGE, 11, parse_rule("then:3", 11))
    assert (steps, held) == (3, 11 + 11 + 5)


def test_a_wrong_draft_ends_the_step_where_a_led_lookup_holds():
    # The draft misses every position; the lookup has the quote.
    wrong = [7] * len(PASSAGE)
    then = score(PROMPT, PASSAGE, wrong, 8, parse_rule("then:3", 8))
    led = score(PROMPT, PASSAGE, wrong, 8, parse_rule("led:3:3", 8))
    assert then[:2] == (29, 0)  # every step 1 token: the bonus
    # Bonus tokens PASSAGE[0] and [1] match 1 and 2 tokens (the prompt's
    # token before the passage differs): the draft's wrong token. From [2]
    # on the match is 3 long and the lookup leads all 8: bonus 2, 11, 20.
    assert led[:2] == (5, 24)
    # A match of 8 first at bonus [7]: 7 steps of nothing, then 8, 8 and 4.
    assert score(PROMPT, PASSAGE, wrong, 8, parse_rule("led:3:8", 8))[:2] == (10, 20)


def test_lookup_alone_proposes_from_the_bonus_token():
    answer = PASSAGE[:10]
    steps, held, _ = score(PROMPT, answer, [7] * 10, 4, parse_rule("lookup", 4))
    # Bonus tokens [0] and [1]: keys of 1 and 2 tokens, nothing; from [2]
    # the lookup proposes [3:7], then [8:10] until the answer ends.
    assert (steps, held) == (4, 6)


@pytest.mark.parametrize("text", ["then", "led:3", "led:3:0", "led:3:2", "then:13",
                                  "adapt:3:3", "other"])
def test_bad_rules_are_refused(text):
    with pytest.raises(ValueError):
        parse_rule(text, 12)


def test_the_forecast_is_the_models_greedy_token_after_each_prefix():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    model = transformers.Qwen2ForCausalLM(config).eval()
    prompt = torch.randint(0, 64, (20,)).tolist()
    ids, answer = list(prompt), []
    with torch.inference_mode():
        for _ in range(12):  # greedy decoding, one token at a time
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            answer.append(token)
    assert forecast(model, prompt, answer) == answer
    # Teacher-forced on another answer: each token is the greedy one after
    # that answer's own prefix.
    other = [(t + 1) % 64 for t in answer]
    got = forecast(model, prompt, other)
    with torch.inference_mode():
        want = [int(model(torch.tensor([prompt + other[:i]])).logits[0, -1].argmax())
                for i in range(len(other))]
    assert got == want


def test_adapt_drafts_more_two_steps_after_the_lookup_missed():
    # An answer the prompt does not hold, a draft that knows it: the lookup
    # never holds, so from the third step (the host knows the first) the
    # rule drafts 6: bonus tokens at 0, 4, 8, 15, 22, 29 and 36.
    answer = list(range(500, 540))
    assert score(PROMPT, answer, answer, 12, parse_rule("then:3", 12)) == (10, 30, 30)
    assert score(PROMPT, answer, answer, 12, parse_rule("adapt:3:6", 12)) == (7, 33, 36)
    # hi = K leaves nothing to look up: it holds while every draft holds
    # (bonus tokens at 0, 4, 8, 21 and 34).
    assert score(PROMPT, answer, answer, 12, parse_rule("adapt:3:12", 12)) == (5, 35, 42)


def test_vllm_ngram_takes_the_earliest_five_token_match():
    from benchmarks.realpair.rules import vllm_ngram

    # The last 5 tokens [1..5] occur at 0 and 10: the earliest wins, and its
    # followers may run into the sequence's own end.
    tokens = np.array([1, 2, 3, 4, 5, 60, 61, 0, 0, 0,
                       1, 2, 3, 4, 5, 70, 1, 2, 3, 4, 5])
    assert vllm_ngram(tokens, 3).tolist() == [60, 61, 0]
    assert vllm_ngram(tokens[:9], 3).tolist() == []  # no earlier match
    assert vllm_ngram(np.array([7, 7, 7, 7, 7, 7, 7]), 4).tolist() == [7, 7]


def test_ngram_steps_without_a_proposal_count_as_steps():
    # vLLM counts a draft only where the lookup proposed; the score counts
    # every step, as the other rules do.
    steps, held, drafted = score(PROMPT, PASSAGE[:12], [7] * 12, 4,
                                 parse_rule("ngram", 4))
    # Bonus [0]..[3]: fewer than 5 quoted tokens verified, no proposal (4
    # steps); from [4] the passage's followers: [5:9], then [10:12].
    assert (steps, held, drafted) == (6, 6, 0)


def _files(tmp_path, answer):
    """A one-case cases file and a plain result file answering it."""
    from benchmarks.realpair import tasks

    case = tasks.Case(id="copy-16384-00-quote_code", group="copy", kind="quote_code",
                      context=16384, prompt_ids=PROMPT, prompt_tokens=len(PROMPT),
                      max_tokens=64, expected=None, meta={})
    cases = tmp_path / "cases.jsonl"
    header = tasks.save_cases([case], str(cases))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"meta": {"cases_sha256": header["sha256"]},
                                 "records": [
        {"id": case.id, "group": "copy", "context": 16384, "batch": 1,
         "output_ids": answer}]}))
    return cases, plain, header


def test_the_command_scores_rules_and_refuses_other_cases(tmp_path):
    from benchmarks.realpair import rules

    cases, plain, header = _files(tmp_path, PASSAGE)
    fc = tmp_path / "forecast.json"
    fc.write_text(json.dumps({"meta": {"cases_sha256": header["sha256"]}, "models": {
        "draft": {"forecast": {"copy-16384-00-quote_code": PASSAGE}}}}))
    out = tmp_path / "rules.json"
    assert rules.main(["--cases", str(cases), "--outputs", str(plain), "--forecast",
                       str(fc), "--k", "4", "--rules", "draft", "lookup",
                       "--out", str(out)]) == 0
    rows = {r["rule"]: r for r in json.loads(out.read_text())["rows"]}
    # 29 tokens after the first in 6 steps: the last reaches the answer's
    # end and has no bonus token.
    assert rows["draft"]["steps"] == 6 and rows["draft"]["acc_len"] == round(29 / 6, 3)
    assert rows["lookup"]["drafted_per_step"] == 0
    # A rule that drafts needs the forecast; a plain file of other cases is refused.
    with pytest.raises(SystemExit):
        rules.main(["--cases", str(cases), "--outputs", str(plain), "--rules", "draft",
                    "--out", str(out)])
    other = json.loads(plain.read_text())
    other["meta"]["cases_sha256"] = "0" * 64
    plain.write_text(json.dumps(other))
    with pytest.raises(SystemExit):
        rules.main(["--cases", str(cases), "--outputs", str(plain), "--rules", "lookup",
                    "--out", str(out)])
