"""Chat templates for every target: the GGUF's own, else llama.cpp's built-in for its architecture or vocabulary,
else --chat-template NAME|FILE; a target with none of them is refused before `train` harvests a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_gguf.textgen.builtin_templates import BUILTINS
from dflash_gguf.textgen.chat import ChatTemplateError, model_template, read_choice, render_chat

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]


class FakeModel:
    """The slice of native.wrappers.Model templates use: a vocabulary of named special tokens."""

    def __init__(self, arch: str, specials: set[str], own: str | None = None):
        self.arch, self.specials, self.own, self.path = arch, specials, own, Path(f"{arch}.gguf")

    def chat_template(self):
        return self.own

    def tokenize(self, text, add_special=False, parse_special=True):
        return [0] if text in self.specials else list(range(len(text)))

    def bos(self):
        return 1

    def eos(self):
        return 2

    def token_bytes(self, token, special=False):
        return {1: b"<bos>", 2: b"<eos>"}[token]


# inputs with no system message, one (with spaces to trim), several (one of them after the first user turn)
CHATS = {
    "user": MESSAGES[1:2],
    "system": MESSAGES,
    "systems": [{"role": "system", "content": " Be brief. "}, {"role": "system", "content": "Answer in French."},
                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Salut. "},
                {"role": "system", "content": "Now in English."}, {"role": "user", "content": "Bye"}],
}
# Gemma, Llama 3 and Mistral models put BOS in the text: llama.cpp's built-ins leave it to the tokenizer (add_bos),
# our templates write it; llama.cpp writes Mistral's EOS text `</s>` itself, ours the model's eos_token
BOS, EOS = "<bos>", "</s>"
WRITES_BOS = {"gemma", "llama3", "mistral-v7"}


def llama_cpp_render(name: str, messages: list[dict], add_ass: bool = True) -> str:
    """llama.cpp's own rendering (llama_chat_apply_template with a built-in template's name)."""
    import ctypes

    from dflash_gguf.native.lib import load
    lc = load().llama_cpp
    keep = [(m["role"].encode(), m["content"].encode()) for m in messages]
    chat = (lc.llama_chat_message * len(keep))(*[lc.llama_chat_message(role=r, content=c) for r, c in keep])
    n = lc.llama_chat_apply_template(name.encode(), chat, len(keep), add_ass, None, 0)
    assert n >= 0, f"llama.cpp has no built-in template {name!r}"
    buf = ctypes.create_string_buffer(n + 1)
    assert lc.llama_chat_apply_template(name.encode(), chat, len(keep), add_ass, buf, n + 1) == n
    return buf.raw[:n].decode()


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_render_as_llama_cpp_formats_them(name, chat):
    """Fails when one of our jinja copies drifts from llama.cpp's built-in (e.g. Gemma keeping only the last of
    several system messages, or not trimming them)."""
    messages = CHATS[chat]
    ours = render_chat(BUILTINS[name].jinja, messages, bos_token=BOS, eos_token=EOS)
    assert ours == (BOS if name in WRITES_BOS else "") + llama_cpp_render(name, messages)


def test_system_messages_are_turns_of_their_own_or_merged_into_the_next_user_turn():
    """How several system messages come out: ChatML keeps each as its own turn; Gemma has no system role and
    opens the next user turn with them, trimmed and joined."""
    systems = CHATS["systems"]
    assert llama_cpp_render("chatml", systems).count("<|im_start|>system\n") == 3
    gemma = llama_cpp_render("gemma", systems)
    assert "system" not in gemma
    assert gemma.startswith("<start_of_turn>user\nBe brief.Answer in French.\n\nHi<end_of_turn>\n")
    assert "<start_of_turn>user\nNow in English.\n\nBye<end_of_turn>\n" in gemma


def test_the_gguf_template_wins_then_the_architecture_then_the_vocabulary():
    own = FakeModel("gemma3", set(BUILTINS["gemma"].special), own="{{ messages[0]['content'] }}")
    assert model_template(own).is_models_own
    gemma = model_template(FakeModel("gemma3", set(BUILTINS["gemma"].special)))
    assert gemma.text == BUILTINS["gemma"].jinja and "gemma" in gemma.source and "gemma3" in gemma.source
    # a llama GGUF without a template whose vocabulary is ChatML's (SmolLM2-like) gets chatml, not llama3
    assert model_template(FakeModel("llama", set(BUILTINS["chatml"].special))).text == BUILTINS["chatml"].jinja
    # the architecture's template is refused when the vocabulary lacks its tokens
    assert model_template(FakeModel("gemma3", set(BUILTINS["chatml"].special))).text == BUILTINS["chatml"].jinja
    with pytest.raises(ChatTemplateError, match="no llama.cpp built-in template fits"):
        model_template(FakeModel("llama", set()))


def test_chat_template_option_takes_a_name_or_a_file(tmp_path):
    bare = FakeModel("llama", set())
    assert model_template(bare, "chatml").text == BUILTINS["chatml"].jinja
    f = tmp_path / "t.jinja"
    f.write_text("{{ messages[-1]['content'] }}")
    chosen = model_template(bare, str(f))
    assert chosen.text == f.read_text() and "t.jinja" in chosen.source
    assert read_choice(None) is None
    with pytest.raises(ChatTemplateError, match="neither a built-in name"):
        read_choice(str(tmp_path / "missing.jinja"))


@pytest.mark.slow
def test_train_refuses_a_target_without_template_before_harvesting(tmp_path, capsys):
    """Fails when train ignores --chat-template (the first error again) or reads it only after its other checks."""
    pytest.importorskip("torch")
    from dflash_gguf.cli import main
    from helpers.engine import write_tiny_llama

    target = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=4, n_embd=64, text=True, seed=3)
    data = tmp_path / "data"
    with pytest.raises(SystemExit) as e:
        main(["train", "-m", str(target), "-o", str(tmp_path / "d.gguf"), "--data-dir", str(data), "-t", "2"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert e.value.code == 2 and len(err) == 1 and "no chat template" in err[0], err
    assert not (data / "tokens.bin").exists() and not (data / "meta.json").exists()
    # with a template named on the command line the template check passes and so do the taps' (their probe prompts
    # are rendered with it); the disk check after them stops the run: 10^15 tokens cannot fit
    with pytest.raises(SystemExit) as e:
        main(["train", "-m", str(target), "-o", str(tmp_path / "d.gguf"), "--data-dir", str(data), "-t", "2",
              "--chat-template", str(_plain_template(tmp_path)), "--tokens", str(10**15), "--taps", "1,3"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert e.value.code == 2 and len(err) == 1 and "the harvest needs" in err[0] and "lower --tokens" in err[0], err
    assert not (data / "tokens.bin").exists()


def _plain_template(tmp_path: Path) -> Path:
    f = tmp_path / "plain.jinja"
    f.write_text("{% for m in messages %}{{ m['content'] }} {% endfor %}")
    return f


def test_run_chat_takes_the_template_option_and_refuses_a_model_without_any(tmp_path, capsys):
    from dflash_gguf.cli import main
    from helpers.engine import write_tiny_llama

    target = write_tiny_llama(tmp_path / "tiny.gguf", n_layer=2, n_embd=64, text=True, seed=3)
    argv = ["run", "-m", str(target), "--plain", "--chat", "-p", "t5 t9", "-n", "2", "-t", "1", "--json"]
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert e.value.code == 2 and len(err) == 1 and "no chat template" in err[0], err
    with pytest.raises(SystemExit) as e:
        main(argv + ["--chat-template", str(_plain_template(tmp_path))])
    captured = capsys.readouterr()
    assert e.value.code == 0 and "chat template: file plain.jinja (--chat-template)" in captured.err and '"tokens"' in captured.out
