"""Small tokenizers built from scratch in memory, shaped like the real ones of each text encoder.

* CLIP: lower-cased, CLIP's word/digit/punctuation split, byte-level pieces,
  ``<|startoftext|> ... <|endoftext|>`` (padding with ``<|endoftext|>``).
* T5: SentencePiece-style Unigram over ``▁``-prefixed pieces, ``... </s>``, ``<pad>`` = 0.
* Llama (HunyuanVideo's text encoder): Llama-3's split, byte-level pieces, ``<|begin_of_text|>`` prepended,
  the Llama-3 chat header tokens as special tokens. HunyuanVideo's default prompt template then puts exactly
  ``crop_start`` = 95 tokens before the user prompt, as the real Llama-3 tokenizer does, so the pipeline's
  cropping removes the template and keeps the prompt (a test checks this).

The models are whole-word lookups with a fallback to single bytes: every word of a built-in vocabulary of
common prompt words is one token, any other text still tokenizes (into bytes), so distinct prompts give
distinct ids. The `tokenizers` objects are wrapped in the transformers class each pipeline names
(``CLIPTokenizer``, ``T5TokenizerFast``, ``LlamaTokenizerFast``; in transformers 5 the fast classes carry the
plain names), falling back to ``PreTrainedTokenizerFast`` where a class cannot wrap a ready tokenizer.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

WORDS = """
a an the of and or with in on at to from by for over under above below near into onto through across
is are was were be being been has have had it its this that these those there here very some many few
one two three four five six seven eight nine ten small big large tiny huge tall short long old young new
cat cats dog dogs bird birds fish horse horses cow lion tiger bear fox wolf rabbit mouse owl eagle duck
man woman men women person people child children boy girl baby family friends crowd robot astronaut
red orange yellow green blue purple pink brown black white gray grey golden silver dark bright colorful
sun moon star stars sky cloud clouds rain snow fog wind storm light shadow sunset sunrise night day
morning evening city street road bridge building house tower castle village forest tree trees flower
flowers grass field garden mountain mountains hill river lake ocean sea beach wave waves water fire
desert island space planet galaxy car cars train boat ship plane bicycle window door room table chair
book cup food bread apple coffee walks walking runs running flies flying swims swimming sits sitting
jumps jumping plays playing dances dancing eats eating looks looking reads stands standing drives
slowly quickly gently beautiful cinematic realistic photo painting portrait landscape detailed closeup
close up view shot camera pans zooms scene video image style art high quality 4k 8k hd soft sharp warm
cold calm wild happy sad cute funny epic magical futuristic ancient modern vintage neon glowing
describe detailing following aspects main content theme color shape size texture quantity text
spatial relationships objects actions events behaviors temporal physical movement changes background
environment style atmosphere angles movements transitions used system user
""".split()


LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|finetune_right_pad_id|>")


def _byte_alphabet() -> list[str]:
    return sorted(pre_tokenizers.ByteLevel.alphabet())


def _word_pieces(vocab: dict[str, int], words, *, spaced: bool, bare: bool) -> None:
    """Add whole words as byte-level pieces (``Ġword`` with a leading space, ``word`` without)."""
    for word in words:
        forms = []
        if spaced:
            forms.append("Ġ" + word)
        if bare:
            forms.append(word)
        for form in forms:
            vocab.setdefault(form, len(vocab))


def _word_bpe(vocab: dict[str, int], unk: str | None, **kwargs) -> models.BPE:
    # No merges, and ``ignore_merges``: a pre-token that is a vocabulary entry is one token; anything else
    # falls back to single bytes (never to unk: every byte is in the vocabulary).
    return models.BPE(vocab=vocab, merges=[], unk_token=unk, fuse_unk=False, ignore_merges=True, **kwargs)


# -- CLIP ----------------------------------------------------------------------------------------------------
CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"


def clip_tokenizer_object() -> Tokenizer:
    alphabet = _byte_alphabet()
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(alphabet)}
    for ch in alphabet:
        vocab[ch + "</w>"] = len(vocab)
    _word_pieces(vocab, dict.fromkeys(w.lower() for w in WORDS), spaced=False, bare=True)
    vocab[CLIP_BOS] = len(vocab)
    vocab[CLIP_EOS] = len(vocab)
    tok = Tokenizer(_word_bpe(vocab, CLIP_EOS, continuing_subword_prefix="", end_of_word_suffix="</w>"))
    tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "),
                                           normalizers.Lowercase()])
    # CLIP's own split (words, single digits, punctuation runs; whitespace dropped), then bytes.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|"""
                                   r"""[\p{N}]|[^\s\p{L}\p{N}]+"""), behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.RobertaProcessing((CLIP_EOS, vocab[CLIP_EOS]), (CLIP_BOS, vocab[CLIP_BOS]),
                                                      trim_offsets=False, add_prefix_space=False)
    tok.add_special_tokens([CLIP_BOS, CLIP_EOS])
    return tok


# -- T5 ------------------------------------------------------------------------------------------------------
def t5_tokenizer_object() -> Tokenizer:
    pieces: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    chars = [chr(c) for c in range(33, 127)]
    pieces += [(c, -8.0) for c in chars] + [("▁" + c, -7.0) for c in chars]
    seen = {p for p, _ in pieces}
    for word in dict.fromkeys(WORDS):
        for piece in ("▁" + word, "▁" + word.capitalize()):
            if piece not in seen:
                seen.add(piece)
                pieces.append((piece, -2.0))
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
    ])
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.post_processor = processors.TemplateProcessing(single=["$A", "</s>"], pair=["$A", "</s>", "$B", "</s>"],
                                                       special_tokens=[("</s>", 1)])
    tok.add_special_tokens(["<pad>", "</s>", "<unk>"])
    return tok


# -- Llama (HunyuanVideo) ------------------------------------------------------------------------------------
def llama_tokenizer_object() -> Tokenizer:
    vocab: dict[str, int] = {ch: i for i, ch in enumerate(_byte_alphabet())}
    vocab["ĊĊ"] = len(vocab)
    words = dict.fromkeys(f for w in WORDS for f in (w, w.capitalize()))
    _word_pieces(vocab, words, spaced=True, bare=True)
    for special in LLAMA_SPECIALS:
        vocab[special] = len(vocab)
    tok = Tokenizer(_word_bpe(vocab, None))
    # Llama-3's split (words keep their leading space, numbers in runs of <= 3 digits), then bytes.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                                   r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""),
                             behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    bos = LLAMA_SPECIALS[0]
    tok.post_processor = processors.TemplateProcessing(single=[bos, "$A"], pair=[bos, "$A", bos, "$B"],
                                                       special_tokens=[(bos, vocab[bos])])
    tok.add_special_tokens(list(LLAMA_SPECIALS))
    return tok


# -- wrapping ------------------------------------------------------------------------------------------------
def _wrap(tok: Tokenizer, class_names: tuple[str, ...], probe: str, **kwargs):
    """The tokenizer in the first transformers class of ``class_names`` that wraps it faithfully."""
    import transformers

    expected = tok.encode(probe).ids
    kwargs.setdefault("padding_side", "right")  # the pipelines crop/pool assuming right padding
    for name in class_names:
        cls = getattr(transformers, name, None)
        if cls is None:
            continue
        try:
            wrapped = cls(tokenizer_object=tok, **kwargs)
        except Exception:  # noqa: BLE001 - some classes cannot wrap a ready tokenizer; try the next one
            continue
        if wrapped(probe)["input_ids"] == expected:
            return wrapped
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


_PROBE = "A cat walks on the grass, realistic 4k; zebra!"


def clip_tokenizer(model_max_length: int = 77):
    return _wrap(clip_tokenizer_object(), ("CLIPTokenizerFast", "CLIPTokenizer"), _PROBE,
                 bos_token=CLIP_BOS, eos_token=CLIP_EOS, unk_token=CLIP_EOS, pad_token=CLIP_EOS,
                 model_max_length=model_max_length)


def t5_tokenizer(model_max_length: int = 512):
    return _wrap(t5_tokenizer_object(), ("T5TokenizerFast", "T5Tokenizer"), _PROBE,
                 eos_token="</s>", unk_token="<unk>", pad_token="<pad>", extra_ids=0,
                 model_max_length=model_max_length)


def llama_tokenizer(model_max_length: int = 1024):
    return _wrap(llama_tokenizer_object(), ("LlamaTokenizerFast", "LlamaTokenizer"), _PROBE,
                 bos_token=LLAMA_SPECIALS[0], eos_token=LLAMA_SPECIALS[1],
                 pad_token=LLAMA_SPECIALS[5], model_max_length=model_max_length)


def qwen_tokenizer(model_max_length: int = 1024):
    """Qwen-Image's Qwen2.5-VL tokenizer stand-in: the Llama-3-style byte-level BPE above (its chat markup
    tokenizes into bytes; the pipeline drops a fixed number of template tokens either way)."""
    return _wrap(llama_tokenizer_object(), ("Qwen2TokenizerFast", "Qwen2Tokenizer"), _PROBE,
                 bos_token=LLAMA_SPECIALS[0], eos_token=LLAMA_SPECIALS[1],
                 pad_token=LLAMA_SPECIALS[5], model_max_length=model_max_length)
