"""Builds Gemma-style tokenizer.json files with the `tokenizers` package (shared by the tools/ scripts).

The layout follows ../shared/reference/gemma4.md section 5: a BPE model with byte_fallback=True and
fuse_unk=True, normalizer Replace(" ", "\u2581"), pre-tokenizer Split(" ", merged_with_previous),
decoder Replace("\u2581", " ") -> ByteFallback -> Fuse (optionally -> Strip(" ", 1, 0)), special
tokens <pad>=0 <eos>=1 <bos>=2 <unk>=3 <mask>=4 followed by a few Gemma 4 control tokens, then the
256 byte tokens <0x00>..<0xFF>, then the merged tokens learned from the given texts.
"""
import json
import os

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
CONTROL = ["<|turn>", "<turn|>", "<|think|>", "<|channel>", "<channel|>"]
SPACE = "\u2581"


def _gemma_pre_tokenizer():
    return pre_tokenizers.Split(" ", "merged_with_previous")


def train_and_save(texts, out_dir, vocab_size, word_level_merges, strip_decoder=False,
                   drop_bytes=(), extra_added=(), bos_template=True, config=None):
    """Trains on texts and writes out_dir/tokenizer.json (+ tokenizer_config.json when config).

    word_level_merges: train with the text split before each "\u2581" so that no merge spans two
    words (the saved file still uses Gemma's pre-tokenizer, which gives the same ids for such a
    vocabulary); otherwise each text is one word and merges may span spaces (whitespace runs).
    drop_bytes: byte values whose <0xXX> token is left out (to test the unk path).
    extra_added: AddedToken objects added after training (non-special added tokens).
    """
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    if word_level_merges:
        tok.pre_tokenizer = pre_tokenizers.Split(SPACE, "merged_with_next")
    else:
        tok.pre_tokenizer = _gemma_pre_tokenizer()
    n_bytes = 256 - len(drop_bytes)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_bytes, special_tokens=SPECIALS + CONTROL,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)

    # Re-number: specials and control tokens first, then the byte tokens, then everything learned.
    j = json.loads(tok.to_str())
    old = sorted(j["model"]["vocab"].items(), key=lambda kv: kv[1])
    head = [t for t, _ in old if t in SPECIALS or t in CONTROL]
    byte_toks = [f"<0x{b:02X}>" for b in range(256) if b not in drop_bytes]
    rest = [t for t, _ in old if t not in head and t not in byte_toks]
    order = head + byte_toks + rest
    vocab = {t: i for i, t in enumerate(order)}
    j["model"]["vocab"] = vocab
    for a in j["added_tokens"]:
        a["id"] = vocab[a["content"]]
    out = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    out.pre_tokenizer = _gemma_pre_tokenizer()
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_decoder:
        steps.append(decoders.Strip(" ", 1, 0))
    out.decoder = decoders.Sequence(steps)
    if bos_template:
        out.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    if extra_added:
        out.add_tokens(list(extra_added))
    os.makedirs(out_dir, exist_ok=True)
    out.save(os.path.join(out_dir, "tokenizer.json"), pretty=True)
    if config is not None:
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return out


def default_config(add_bos=True, add_eos=False, max_len=512):
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "mask_token": "<mask>",
        "model_max_length": max_len,
        "padding_side": "right",
    }


__all__ = ["train_and_save", "default_config", "AddedToken", "SPECIALS", "CONTROL"]
