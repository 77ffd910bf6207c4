"""The built-in character-level tokenizer of the tiny policy and teacher.

Every character of the vocabulary is one token and every tag of the agent format
(``<call>``, ``</obs>``, ...) is one special token, so a turn boundary is always a single
id the engine can stop on. Built with the ``tokenizers`` library and wrapped as a
``PreTrainedTokenizerFast`` so it saves and loads with the model directory like any
Hugging Face tokenizer (``save_pretrained`` / ``AutoTokenizer.from_pretrained``).
"""

from __future__ import annotations

import string

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
CALL, CALL_END = "<call>", "</call>"
OBS, OBS_END = "<obs>", "</obs>"
ANS, ANS_END = "<ans>", "</ans>"
AGENT_TAGS: tuple[str, ...] = (CALL, CALL_END, OBS, OBS_END, ANS, ANS_END)
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK, *AGENT_TAGS)

# The built-in format as a chat template, so the built-in models take the same chat path as
# any HF chat model (learner.tasks.chat): a user message renders as "Q:<content>\n" after
# <bos>, an assistant turn as its own text (tags included), a tool message as
# "<obs>...</obs>"; system messages have no place in the format and render as nothing.
# arith-tool's prompt through it is exactly Task.prompt_text.
BUILTIN_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'user' %}{{ 'Q:' + m['content'] + '\\n' }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] }}"
    "{% elif m['role'] == 'tool' %}{{ '<obs>' + m['content'] + '</obs>' }}"
    "{% endif %}{% endfor %}"
)

CHARACTERS: str = string.digits + "+-*()=?: \n" + string.ascii_uppercase + string.ascii_lowercase


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """A WordLevel model over single characters; special tokens take ids 0..9.

    The pre-tokenizer isolates every character (``[\\s\\S]`` also matches the newline) and
    the ``Fuse`` decoder joins tokens without separators, so ``decode(encode(s)) == s`` for
    any string over ``CHARACTERS`` plus the tags.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in CHARACTERS:
        vocab[ch] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=list(AGENT_TAGS),
        clean_up_tokenization_spaces=False,
        chat_template=BUILTIN_CHAT_TEMPLATE,
    )
