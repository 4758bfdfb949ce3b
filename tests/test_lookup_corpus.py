"""The lookup's corpus (what the target answered before): the longest suffix of 3..6 tokens found in the recorded
answers drafts what followed it, only where the request's own text has no match of 2; its matches are kept apart
from the request's own by match length; capped oldest-first; the learn store feeds it this target's answers."""

import pytest

from dflash_gguf.engine.sources.corpus import MAX_NGRAM, MIN_NGRAM, Corpus
from dflash_gguf.engine.sources.lookup import LookupSource
from dflash_gguf.learn.store import LearnStore, Recorder, Tags


def test_the_longest_suffix_wins_and_its_latest_occurrence():
    c = Corpus([[1, 2, 3, 4, 5, 6], [9, 2, 3, 4, 7, 8, 0], [5, 1, 2, 3, 4, 11, 12]])
    # [2, 3, 4] occurs in all three (latest: the third, then 11); [1, 2, 3, 4] in the first and third
    assert c.match([8, 1, 2, 3, 4], 2) == ([11, 12], 4)
    assert c.match([8, 9, 2, 3, 4], 5) == ([7, 8, 0], 4)
    assert c.match([0, 2, 3, 4], 1) == ([11], 3)
    # shorter than MIN_NGRAM, or seen nowhere: no draft
    assert c.match([3, 4], 4) == ([], 0)
    assert c.match([7, 7, 7, 7], 4) == ([], 0)
    assert c.match([1, 2, 3], 0) == ([], 0)
    assert MIN_NGRAM == 3 and MAX_NGRAM == 6


def test_added_answers_join_and_the_cap_drops_the_oldest():
    c = Corpus(max_tokens=24)
    c.add([1, 2, 3])                      # too short to have an n-gram with a next token: not kept
    assert len(c) == 0
    for first in (1, 10, 20):
        c.add(list(range(first, first + 8)))
    assert len(c) == 3 and c.n_tokens == 24 and c.match([1, 2, 3], 2) == ([4, 5], 3)
    c.add(list(range(30, 38)))            # 32 tokens > 24: the oldest go until 3/4 of the cap, the index is rebuilt
    assert len(c) == 2 and c.n_tokens == 16
    assert c.match([1, 2, 3], 2) == ([], 0) and c.match([11, 12, 13], 2) == ([], 0)
    assert c.match([21, 22, 23], 2) == ([24, 25], 3) and c.match([31, 32, 33], 1) == ([34], 3)
    with pytest.raises(ValueError):
        Corpus(max_tokens=0)


def test_the_request_s_own_match_comes_first_and_the_corpus_s_is_reported_apart():
    corpus = Corpus([[40, 41, 42, 43, 44, 45]])
    s = LookupSource(n_vocab=50, block_size=8, max_ngram=4, corpus=corpus)
    assert s.match_classes == 4 + MAX_NGRAM
    s.begin()
    s.see([1, 2, 40, 41, 42])
    assert s.match(2) == ([43, 44], 4 + 3)             # no own match: the corpus's, length 3 above max_ngram
    s.see([43, 1, 2])                                   # [1, 2] occurred in the request: its own match wins
    assert s.match(2) == ([40, 41], 2)
    s.see([9, 9])                                       # [9] matches itself once (length 1 < 2): the corpus has
    assert s.match(2) == ([9, 9], 1)                    # nothing for [..., 9, 9], so the request's own stays
    plain = LookupSource(n_vocab=50, block_size=8, max_ngram=4)
    assert plain.match_classes == 4


def test_the_recorder_hands_this_target_s_newest_answers(tmp_path):
    target = tmp_path / "t.gguf"
    target.write_bytes(b"target bytes")
    rec = Recorder(LearnStore(tmp_path / "learn"), target)
    rec.record([1], [1, 2, 3, 4], template=None, drafter=None)
    LearnStore(tmp_path / "learn").record(Tags("o.gguf", "f" * 64), [1], [7, 7, 7, 7])   # another target
    rec.record([1], [5, 6, 7, 8], template=None, drafter=None)
    (tmp_path / "learn" / "zz-broken.json").write_text("{")
    rec.record([1], [9, 10, 11, 12], template=None, drafter=None)
    assert rec.recent_answers(100) == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert rec.recent_answers(5) == [[5, 6, 7, 8], [9, 10, 11, 12]]      # newest first, until the cap is reached
    assert Recorder(LearnStore(tmp_path / "none"), target).recent_answers(100) == []
