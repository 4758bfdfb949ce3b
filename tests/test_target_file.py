"""TargetFile: one description of a target GGUF, its end-of-generation ids from one shared llama.cpp model."""

from __future__ import annotations

import hashlib

import pytest

from dflash_gguf.errors import UserError
from dflash_gguf.target_file import TargetFile


@pytest.mark.parametrize("which, end_of_turn", [("smollm2", "<|im_end|>"), ("gemma3", "<end_of_turn>")])
def test_eog_ids_are_the_tokens_llama_cpp_ends_on_from_one_shared_model(which, end_of_turn):
    from dflash_gguf import packaged_models
    from dflash_gguf.native.wrappers import Model
    path = packaged_models.smollm2_q4_1() if which == "smollm2" else packaged_models.gemma3_270m()
    with TargetFile.open(path) as target:
        eog = target.eog_ids
        model = target.model()
        assert target.model() is model                        # loaded once, shared
        turn_end = model.tokenize(end_of_turn, add_special=False, parse_special=True)
        assert len(turn_end) == 1 and turn_end[0] in eog and model.eos() in eog
    assert target._model is None                              # closed with the `with`
    separate = Model(path)
    try:
        assert eog == [t for t in range(separate.n_vocab) if separate.is_eog(t)]
    finally:
        separate.close()


def test_header_facts_and_digest(target):
    t = TargetFile.open(target)
    assert (t.arch, t.n_embd, t.n_layer, t.n_vocab) == ("llama", 64, 3, 64)
    assert t.sha256 == hashlib.sha256(target.read_bytes()).hexdigest()
    assert t.tensors["token_embd.weight"].shape == (64, 64)


def test_missing_file_and_a_drafter_are_one_line_errors_naming_the_file(tmp_path, upstream):
    with pytest.raises(UserError, match=f"{tmp_path / 'nope.gguf'}: no such file"):
        TargetFile.open(tmp_path / "nope.gguf")
    with pytest.raises(UserError, match="is a DFlash drafter, not a target model"):
        TargetFile.open(upstream)
    (tmp_path / "text.gguf").write_text("not a model")
    with pytest.raises(UserError, match="text.gguf"):
        TargetFile.open(tmp_path / "text.gguf")
