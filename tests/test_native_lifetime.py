"""Native objects are freed in the order llama.cpp needs, whatever order Python closes or collects them in.

A llama context uses its model's tensors (and a drafter's context the memory of the target context it is linked
to) until it is freed. Freeing the model first and leaving the context to the garbage collector freed into
released memory: AddressSanitizer reports a heap-use-after-free in ~llama_context, and without it glibc aborted CI
once ("corrupted size vs. prev_size") in a later, unrelated decode. So closing a model closes its contexts first,
closing a context closes the contexts linked to it first, and a closed context refuses to decode; a closed model
refuses every use (its vocabulary handle points into freed memory too)."""

from __future__ import annotations

import gc

import pytest

from dflash_gguf.assets import shipped_drafter_for
from dflash_gguf.native.wrappers import Batch, Context, ContextSettings, DecodeError, Model, ModelClosedError
from dflash_gguf.packaged_models import smollm2_q4_1

SETTINGS = ContextSettings(n_ctx=256, n_batch=32, n_ubatch=32, n_threads=2)


@pytest.fixture(scope="module")
def smollm2():
    return smollm2_q4_1()


def _prompt_batch(model: Model) -> Batch:
    tokens = model.tokenize("The capital of France is", add_special=False)
    batch = Batch(model.native, len(tokens))
    batch.set_tokens(tokens, 0, logits="last")
    return batch


def test_closing_a_model_closes_its_open_contexts_first(smollm2):
    model = Model(smollm2, devices=("none",))
    first, second = Context(model, SETTINGS), Context(model, SETTINGS)
    batch = _prompt_batch(model)
    first.decode(batch)
    model.close()
    assert first.ptr is None and second.ptr is None
    with pytest.raises(DecodeError, match="closed context"):
        first.decode(batch)
    del first, second
    gc.collect()                 # collecting them now frees nothing twice


def test_closing_a_target_context_closes_the_drafter_context_linked_to_it(smollm2):
    drafter_path = shipped_drafter_for(smollm2)
    assert drafter_path is not None, "the embedded SmolLM2 ships with its drafter"
    target_model = Model(smollm2, devices=("none",))
    drafter_model = Model(drafter_path, devices=("none",))
    target = Context(target_model, SETTINGS)
    drafter = Context(drafter_model, SETTINGS, other=target)
    unrelated = Context(target_model, SETTINGS)
    target.close()
    assert drafter.ptr is None and unrelated.ptr is not None
    drafter_model.close()
    target_model.close()
    assert unrelated.ptr is None


def test_a_closed_model_refuses_to_tokenize_or_to_open_a_context(smollm2):
    model = Model(smollm2, devices=("none",))
    assert model.tokenize("Hello", add_special=False) and not model.is_eog(model.tokenize("Hi")[0])
    model.close()
    for use in (lambda: model.tokenize("Hello"), lambda: model.is_eog(0), lambda: model.meta("general.name"),
                lambda: Context(model, SETTINGS)):
        with pytest.raises(ModelClosedError, match="closed"):
            use()
    model.close()                # a second close frees nothing twice
