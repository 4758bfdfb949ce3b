"""Chat templates for every target: the GGUF's own, else llama.cpp's built-in for its architecture or vocabulary,
else --chat-template NAME|FILE; a target with none of them is refused before `train` harvests a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_gguf.textgen.builtin_templates import BUILTINS
from dflash_gguf.textgen.chat import ChatTemplateError, model_template, read_choice, render_model_chat

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


def _render(name: str, messages=MESSAGES) -> str:
    model = FakeModel("x", set(BUILTINS[name].special))
    return render_model_chat(model, messages, template=BUILTINS[name].jinja)


def test_builtins_render_as_llama_cpp_formats_them():
    # llama.cpp src/llama-chat.cpp LLM_CHAT_TEMPLATE_GEMMA: system text opens the first user turn, content trimmed
    assert _render("gemma") == ("<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
                                "Hello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert _render("chatml", MESSAGES[1:2]) == "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n"
    assert _render("llama3", MESSAGES[1:2]) == ("<bos><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                                                 "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert _render("phi3", MESSAGES[1:2]) == "<|user|>\n Hi <|end|>\n<|assistant|>\n"
    assert _render("mistral-v7", MESSAGES[:3]) == "<bos>[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST]  Hi [/INST] Hello.<eos>"


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
    # with a template named on the command line the same checks pass (and go on to harvest: stopped by --tokens 1)
    with pytest.raises(SystemExit) as e:
        main(["train", "-m", str(target), "-o", str(tmp_path / "d.gguf"), "--data-dir", str(data), "-t", "2",
              "--chat-template", str(_plain_template(tmp_path)), "--tokens", "1", "--rows", "10", "--draft-vocab",
              "1000000"])
    assert e.value.code == 2 and "--draft-vocab 1000000" in capsys.readouterr().err


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
