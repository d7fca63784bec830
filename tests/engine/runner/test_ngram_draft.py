"""The n-gram drafter (engine/runner/ngram_draft.py): what it proposes, how its draft length follows the request's
acceptance and a drafted row's cost (engine/runner/draft_pace.py), and the drafts it watches while it makes none."""
import numpy as np

from engine.runner.draft_pace import PROBE_STEPS, DraftPace, best_k, expected_tokens
from engine.runner.ngram_draft import NgramDrafter

FREE = 0.0  # a drafted row's cost: free rows make every draft as long as its most


def test_it_proposes_what_followed_the_latest_earlier_occurrence_of_the_longest_tail():
    d = NgramDrafter([1, 2, 3, 4, 5, 9, 2, 3, 4, 7, 8, 6, 2, 3, 4], most=3)
    assert d.propose(FREE) == [7, 8, 6]  # [2, 3, 4] last occurred before 7, 8, 6 (not before 5)
    d.extend([7])
    assert d.propose(FREE) == [8, 6, 2]  # [3, 4, 7] now matches its earlier occurrence


def test_nothing_is_proposed_without_an_earlier_occurrence():
    assert NgramDrafter([1, 2, 3, 4, 5], most=4).propose(FREE) == []
    assert NgramDrafter([5], most=4).propose(FREE) == []


def test_the_best_length_weighs_the_expected_tokens_against_the_rows_cost():
    assert expected_tokens([0.5, 0.5], 2) == 1.75 and expected_tokens([0.5, 0.5], 0) == 1.0
    assert best_k([0.9] * 8, 0.01) == 8  # a GPU's row: nearly free, the longest draft
    assert best_k([0.9] * 8, 0.75) == 1 and best_k([0.95] * 8, 0.75) == 3  # a CPU's row: short drafts
    assert best_k([0.9] + [0.99] * 7, 0.75) >= 6  # ... unless the draft's later tokens are near certain (a run)
    assert best_k([0.6] * 8, 0.75) == 0  # a middling draft does not pay there (one token a step)
    assert best_k([0.5] * 8, 0.5) == 0  # equal rates: the shorter draft
    assert best_k([0.3] * 8, 0.05) == 2 and best_k([0.0] * 8, 0.0) == 0


def test_the_record_follows_the_drafts_kept_and_tried():
    d = DraftPace(most=8)
    assert d.alphas() == [0.5] * 8 and d.budget(FREE) == 8
    d.verified(8, 8)  # all kept: positions 0 .. 7 tried and kept
    assert (d.drafted, d.accepted) == (8, 8) and d.alphas()[0] == 1.9 / 2.8 and d.alphas()[7] > 0.9
    for _ in range(6):
        d.verified(d.budget(FREE), 0)  # a miss at the first position, six times
    assert d.alphas()[0] < 0.3 and d.budget(0.75) == 0 and d.budget(0.01) > 0


def test_a_drafter_that_cannot_watch_probes_with_one_token_after_a_rest():
    d = DraftPace(most=8)
    d.verified(4, 0)
    d.verified(4, 0)
    assert [d.budget(0.75) for _ in range(PROBE_STEPS)] == [0] * (PROBE_STEPS - 1) + [1]
    assert [d.budget(1.2) for _ in range(2 * PROBE_STEPS)] == [0] * 2 * PROBE_STEPS  # no draft could pay


def test_the_whole_lookup_is_watched_against_the_tokens_that_come_whatever_is_drafted():
    context = [1, 2, 3, 4, 5, 6, 1, 2, 3]
    d = NgramDrafter(context, most=3)
    assert d.propose(cost=5.0) == [] and d.watched == [4, 5, 6]  # too dear to draft: watched all the same
    d.extend([4, 5, 6])  # as looked up: three tried, three kept
    assert (d.kept, d.tried) == ([1.9, 1, 1], [2.8, 1, 1]) and (d.drafted, d.accepted) == (0, 0)
    d.extend([1, 2])  # [1, 2] again: its next lookup misses at once
    assert d.propose(cost=FREE) == [3, 4, 5] and d.watched == [3, 4, 5]
    d.verified(3, 0)  # (counted by the watch, not twice)
    d.extend([9])
    assert (d.kept, d.tried) == ([1.71, 0.9, 0.9], [3.52, 0.9, 0.9]) and (d.drafted, d.accepted) == (3, 0)
    assert d.watched == []


def test_a_copying_answer_s_watched_lookups_earn_it_drafts_at_a_cpu_s_cost():
    text = list(range(100, 180))
    d = NgramDrafter(text + text[:4], most=8)  # the answer starts to copy its prompt
    drafts = []
    while not drafts:
        drafts = d.propose(cost=0.75)
        if not drafts:
            d.extend([d.context[len(d.context) - len(text)]])  # the copy goes on, a token a step
    assert len(d.context) <= len(text) + 4 + 3 * 8  # (three lookups watched whole)
    assert drafts == text[len(d.context) - len(text):][: len(drafts)]


def brute_force_lookup(context: list[int], k: int) -> list[int]:
    """What followed the latest earlier occurrence of the longest tail (n from 4 down to 2), by scanning."""
    for n in range(4, 1, -1):
        tail = context[-n:]
        for at in range(len(context) - 1, n - 1, -1):  # the n-gram ending before `at`, latest first
            if len(context) >= n and context[at - n : at] == tail:
                return context[at : at + k]
    return []


def test_the_prompt_s_sorted_index_and_the_answer_s_dict_find_what_a_scan_finds():
    rng = np.random.default_rng(7)
    for trial in range(40):
        vocab = int(rng.choice([5, 50, 151_936, 3_000_000]))
        prompt = rng.integers(0, vocab, int(rng.integers(1, 300))).tolist()
        d = NgramDrafter(prompt, most=6)
        context = list(prompt)
        for _ in range(30):
            assert d.lookup(6) == brute_force_lookup(context, 6), (trial, len(context))
            token = int(rng.integers(0, vocab)) if rng.random() < 0.5 or len(context) < 3 else \
                context[int(rng.integers(0, len(context)))]  # (often a token seen before: matches)
            d.extend([token])
            context.append(token)


def test_a_long_prompt_is_indexed_whole():
    text = list(range(1000, 1000 + 50_000))
    d = NgramDrafter(text + [7] + text[:10], most=8)  # the file, then its start quoted again
    assert d.propose(FREE) == text[10:18]


def test_an_answer_writing_the_prompt_s_code_as_a_json_string_drafts_from_its_escaped_view(tokenizer):
    """A tool call carrying code (engine/runner/escaped_prompt.py): the answer spells each line break `\\n`, where the
    prompt's tokens part from it at every line's start; from the first backslash on, the escaped view drafts across
    lines, which the prompt alone cannot."""
    import inspect
    import json
    import textwrap

    from engine.runner.escaped_prompt import PromptEscapes
    source = inspect.getsource(textwrap.TextWrapper._wrap_chunks)  # real code: lines that do not repeat one another
    code = source[source.index("        lines = []"):]
    prompt = tokenizer.encode(f"Save this file:\n{code}", add_bos=False)
    answer = tokenizer.encode('{"content": "' + json.dumps(code)[1:-1] + '"}', add_bos=False)
    escapes = PromptEscapes(tokenizer)
    assert any(t in escapes.backslash for t in answer) and not any(t in escapes.backslash for t in prompt)

    def kept(d: NgramDrafter) -> int:  # the answer's tokens that came as drafted, each step's draft after its newest
        total, at = 0, 0
        d.extend(answer[:1])
        while at + 1 < len(answer):
            draft, rest = d.lookup(8), answer[at + 1 :]
            run = next((i for i, (a, b) in enumerate(zip(draft, rest)) if a != b), min(len(draft), len(rest)))
            total += run
            d.extend(rest[: run + 1])  # the drafts kept, then the step's own token
            at += run + 1
        return total
    plain, viewed = kept(NgramDrafter(prompt, 8)), kept(NgramDrafter(prompt, 8, escapes))
    steps_plain, steps_viewed = len(answer) - plain, len(answer) - viewed  # (each step: one token, the rest drafts)
    assert viewed > 0.75 * len(answer) and steps_viewed * 1.8 < steps_plain  # (measured: 168 steps against 371)
