"""The tiny model builders live in kernel_hub.report.models (the report's family matrix runs them too)."""

from kernel_hub.report.models import (  # noqa: F401
    FAMILIES,
    GENERIC_FAMILIES,
    GENERIC_SHRINK,
    HAND_FAMILIES,
    diffusers_model,
    family_names,
    flux,
    generic_tiny_model,
    hand_family_names,
    hand_tiny_model,
    llama,
    tiny_config,
    tiny_model,
)


def save_word_tokenizer(path) -> None:
    """A word-level tokenizer (<pad> <s> </s> <unk>, then w4..w127) with a plain chat template, saved at `path`:
    the tiny models' 128-token vocabulary, for serving tests that need a tokenizer folder."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers import models as tok_models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, **{f"w{i}": i for i in range(4, 128)}}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(path)
