"""Chat templates for GGUFs without `tokenizer.chat_template`: jinja equivalents of llama.cpp's built-in ones.

llama.cpp formats such models with templates compiled into `llm_chat_apply_template` (src/llama-chat.cpp). We
keep jinja copies of the common ones, so every command renders through the one jinja path (textgen/chat.py),
and pick one the way a person would: from the architecture, then from the special tokens the vocabulary has.
A template is only picked when every special token it writes is one token of the target's vocabulary.
Templates that open with `{{ bos_token }}` are those whose models put BOS in the text (Gemma, Llama 3, Mistral).
"""

from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Builtin:
    name: str
    jinja: str
    special: tuple[str, ...]          # special tokens it writes; all must exist in the vocabulary


BUILTINS = {b.name: b for b in (
    Builtin("chatml",
            "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
            ("<|im_start|>", "<|im_end|>")),
    # llama.cpp LLM_CHAT_TEMPLATE_GEMMA: system messages, trimmed and joined, open the next user turn; "assistant"
    # is "model"
    Builtin("gemma",
            "{{ bos_token }}{% set ns = namespace(system='') %}{% for m in messages %}"
            "{% if m['role'] == 'system' %}{% set ns.system = ns.system + (m['content'] | trim) %}{% else %}"
            "{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
            "{{ '<start_of_turn>' + role + '\\n' }}"
            "{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}"
            "{{ (m['content'] | trim) + '<end_of_turn>\\n' }}{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}",
            ("<start_of_turn>", "<end_of_turn>")),
    Builtin("llama3",
            "{{ bos_token }}{% for m in messages %}"
            "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + '<|eot_id|>' }}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
            "{% endif %}",
            ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")),
    Builtin("phi3",
            "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}",
            ("<|user|>", "<|assistant|>", "<|end|>")),
    # llama.cpp LLM_CHAT_TEMPLATE_MISTRAL_V7
    Builtin("mistral-v7",
            "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
            "{{ '[SYSTEM_PROMPT] ' + m['content'] + '[/SYSTEM_PROMPT]' }}{% elif m['role'] == 'user' %}"
            "{{ '[INST] ' + m['content'] + '[/INST]' }}{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}"
            "{% endfor %}",
            ("[INST]", "[/INST]")),
)}

# architecture → built-in template llama.cpp's converter / llama-server would use for it; others: vocabulary only
BY_ARCH = {
    "gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma",
    "qwen2": "chatml", "qwen2moe": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "qwen3next": "chatml",
    "qwen35": "chatml", "qwen35moe": "chatml",
    "phi3": "phi3", "mistral3": "mistral-v7", "llama": "llama3",
}


def has_special_tokens(model, builtin: Builtin) -> bool:
    """Every special token the template writes is a single token of the model's vocabulary."""
    return all(len(model.tokenize(t, add_special=False, parse_special=True)) == 1 for t in builtin.special)


def detect(model) -> Builtin | None:
    """The built-in template for this model: its architecture's, else the first whose special tokens the
    vocabulary has; None when none fits."""
    first = BY_ARCH.get(model.arch)
    order = ([BUILTINS[first]] if first else []) + [b for b in BUILTINS.values() if b.name != first]
    return next((b for b in order if has_special_tokens(model, b)), None)
