"""Our transformer's weights as a Hugging Face class holds them, and back: one adapter per family (torchtitan's
state-dict adapters, Megatron-Bridge's mappings), the config side in contract/rules/hf_native.py.

An adapter is names and layouts only, exact both ways (native -> Hugging Face -> native is bitwise the same):
    llama   LlamaForCausalLM: the same Linear layout; q and k rows permuted from our RoPE layout (each head's
            pairs interleaved: dims 2i, 2i+1 rotate together) to transformers' rotate-half (dims i, i + d/2), k by
            its own (key/value) head count under grouped-query attention
    mixtral MixtralForCausalLM: Llama's, with each layer's router and experts (our stacked [experts, ...] weights
            as one Linear per expert and projection, w1 / w3 / w2)
    gpt2    GPT2LMHeadModel: Conv1D weights ([in, out], ours transposed), q, k and v as one c_attn, and the
            biases our Linear layers do not have written as zeros (loading refuses weights whose biases are not)

    to_hf(state)        our state dict -> the Hugging Face class's (a tied head under both names)
    from_hf(saved)      {our name: (the saved names it is made of, how)} for the names a checkpoint holds
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

Tensor = torch.Tensor
Make = Callable[[list[Tensor]], Tensor]  # our tensor from the saved tensors it is made of


def to_rotate_half(w: Tensor, heads: int) -> Tensor:
    """q or k rows (or a bias), ours -> transformers': per head, (pair i, member j) -> row j * d/2 + i."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def to_interleaved(w: Tensor, heads: int) -> Tensor:
    """The inverse of to_rotate_half."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@dataclass(frozen=True)
class Source:
    saved: tuple[str, ...]
    make: Make


class Adapter(Protocol):
    family: str
    prefix: str  # the base model's name in the causal LM's keys (a base model's own checkpoint lacks it)
    ignored: tuple[str, ...]  # saved buffers of older transformers versions that hold no weights (regexes)

    def to_hf(self, state: dict[str, Tensor]) -> dict[str, Tensor]: ...

    def from_hf(self, saved: Iterable[str]) -> dict[str, Source]: ...

    def zero(self, saved: Iterable[str]) -> list[str]:
        """Saved tensors our model has no place for, loadable only when all zero (GPT-2's biases)."""
        ...


def _layer(name: str) -> tuple[str, str | None]:
    """'blocks.3.attn.q.weight' -> ('blocks.{}.attn.q.weight', '3'); other names as they are."""
    found = re.match(r"^(.*?)\.(\d+)\.(.*)$", name)
    if found is None:
        return name, None
    return f"{found.group(1)}.{{}}.{found.group(3)}", found.group(2)


def _qkv_part(t: Tensor, part: int) -> Tensor:
    """GPT-2's c_attn (a Conv1D, stored transposed): its q, k or v block as one of our Linear weights."""
    return t.t().chunk(3)[part]


def _one(make: Callable[[Tensor], Tensor] = lambda t: t) -> Make:
    return lambda tensors: make(tensors[0])


class LlamaAdapter:
    family, prefix = "llama", "model."
    ignored: tuple[str, ...] = (r"rotary_emb\.inv_freq$",)
    NAMES = {"embed.weight": "model.embed_tokens.weight", "final_norm.weight": "model.norm.weight",
             "lm_head.weight": "lm_head.weight",
             "blocks.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
             "blocks.{}.attn.q.weight": "model.layers.{}.self_attn.q_proj.weight",
             "blocks.{}.attn.k.weight": "model.layers.{}.self_attn.k_proj.weight",
             "blocks.{}.attn.v.weight": "model.layers.{}.self_attn.v_proj.weight",
             "blocks.{}.attn.out.weight": "model.layers.{}.self_attn.o_proj.weight",
             "blocks.{}.mlp_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
             "blocks.{}.mlp.gate.weight": "model.layers.{}.mlp.gate_proj.weight",
             "blocks.{}.mlp.up.weight": "model.layers.{}.mlp.up_proj.weight",
             "blocks.{}.mlp.down.weight": "model.layers.{}.mlp.down_proj.weight"}

    def __init__(self, heads: int, kv: int) -> None:
        self.heads = {"blocks.{}.attn.q.weight": heads, "blocks.{}.attn.k.weight": kv}
        self.back = {hf: ours for ours, hf in self.NAMES.items()}

    def to_hf(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {}
        for name, tensor in state.items():
            pattern, layer = _layer(name)
            heads = self.heads.get(pattern)
            out[self.NAMES[pattern].format(layer)] = tensor if heads is None else to_rotate_half(tensor, heads)
        return out

    def from_hf(self, saved: Iterable[str]) -> dict[str, Source]:
        out = {}
        for key in saved:
            pattern, layer = _layer(key)
            ours = self.back.get(pattern)
            if ours is None:  # not a Llama weight: under its own name, which the fit check names as extra
                out[key] = Source((key,), _one())
                continue
            heads = self.heads.get(ours)
            make = _one() if heads is None else _one(partial(to_interleaved, heads=heads))
            out[ours.format(layer)] = Source((key,), make)
        return out

    def zero(self, saved: Iterable[str]) -> list[str]:
        return []


class GPT2Adapter:
    family, prefix = "gpt2", "transformer."
    ignored: tuple[str, ...] = (r"\.attn\.(masked_)?bias$",)  # the causal mask older versions saved
    NAMES = {"embed.weight": "transformer.wte.weight", "pos_embed.weight": "transformer.wpe.weight",
             "final_norm.weight": "transformer.ln_f.weight", "final_norm.bias": "transformer.ln_f.bias",
             "lm_head.weight": "lm_head.weight",
             "blocks.{}.attn_norm.weight": "transformer.h.{}.ln_1.weight",
             "blocks.{}.attn_norm.bias": "transformer.h.{}.ln_1.bias",
             "blocks.{}.mlp_norm.weight": "transformer.h.{}.ln_2.weight",
             "blocks.{}.mlp_norm.bias": "transformer.h.{}.ln_2.bias",
             "blocks.{}.attn.out.weight": "transformer.h.{}.attn.c_proj.weight",
             "blocks.{}.mlp.up.weight": "transformer.h.{}.mlp.c_fc.weight",
             "blocks.{}.mlp.down.weight": "transformer.h.{}.mlp.c_proj.weight"}
    QKV = ("blocks.{}.attn.q.weight", "blocks.{}.attn.k.weight", "blocks.{}.attn.v.weight")
    C_ATTN = "transformer.h.{}.attn.c_attn.weight"
    # Conv1D layers: their weights are ours transposed, and each has a bias ours has not.
    CONV1D = ("transformer.h.{}.attn.c_proj.weight", "transformer.h.{}.mlp.c_fc.weight",
              "transformer.h.{}.mlp.c_proj.weight", C_ATTN)

    def __init__(self) -> None:
        self.back = {hf: ours for ours, hf in self.NAMES.items()}

    def to_hf(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        layers = sorted({layer for layer in (_layer(n)[1] for n in state) if layer is not None}, key=int)
        for name, tensor in state.items():
            pattern, layer = _layer(name)
            if pattern in self.QKV:
                continue
            hf = self.NAMES[pattern].format(layer)
            out[hf] = tensor.t() if _layer(hf)[0] in self.CONV1D else tensor
        for layer in layers:
            qkv = torch.cat([state[p.format(layer)] for p in self.QKV]).t()
            out[self.C_ATTN.format(layer)] = qkv
            for conv in self.CONV1D:  # the biases, zero: ours has none
                weight = out[conv.format(layer)]
                out[conv.format(layer).replace(".weight", ".bias")] = weight.new_zeros(weight.shape[1])
        return out

    def from_hf(self, saved: Iterable[str]) -> dict[str, Source]:
        out = {}
        for key in saved:
            pattern, layer = _layer(key)
            if pattern == self.C_ATTN:
                for i, ours in enumerate(self.QKV):  # c_attn's columns: q, then k, then v (as many heads each)
                    out[ours.format(layer)] = Source((key,), _one(partial(_qkv_part, part=i)))
            elif pattern in self.back:
                conv = pattern in self.CONV1D
                out[self.back[pattern].format(layer)] = Source((key,), _one(torch.t if conv else lambda t: t))
            elif not self._bias(pattern):
                out[key] = Source((key,), _one())
        return out

    def _bias(self, pattern: str) -> bool:
        return pattern.endswith(".bias") and pattern.replace(".bias", ".weight") in self.CONV1D

    def zero(self, saved: Iterable[str]) -> list[str]:
        return [key for key in saved if self._bias(_layer(key)[0])]


class MixtralAdapter(LlamaAdapter):
    """MixtralForCausalLM: Llama's attention and norms; each layer's router and experts as transformers 5 holds them
    (mlp.gate, mlp.experts.gate_up_proj: gate and up stacked per expert, mlp.experts.down_proj), read also as
    save_pretrained writes them (block_sparse_moe.gate, and expert e as block_sparse_moe.experts.e.w1 (our gate[e]),
    w3 (up[e]) and w2 (down[e]))."""

    family = "mixtral"
    NAMES = {k: v for k, v in LlamaAdapter.NAMES.items() if ".mlp." not in k} | {
        "blocks.{}.mlp.router.weight": "model.layers.{}.block_sparse_moe.gate.weight"}
    EXPERTS = {"gate": "w1", "up": "w3", "down": "w2"}
    EXPERT = re.compile(r"^model\.layers\.(\d+)\.block_sparse_moe\.experts\.(\d+)\.(w[123])\.weight$")
    FUSED = re.compile(r"^model\.layers\.(\d+)\.mlp\.(gate\.weight|experts\.gate_up_proj|experts\.down_proj)$")

    def __init__(self, heads: int, kv: int, experts: int) -> None:
        super().__init__(heads, kv)
        self.experts = experts

    def to_hf(self, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """In transformers 5's in-memory layout (what the class loads; its save_pretrained writes w1 / w2 / w3)."""
        dense = {n: t for n, t in state.items() if ".mlp." not in n}
        out = super().to_hf(dense)
        layers = sorted({n.split(".")[1] for n in state if ".mlp.experts." in n}, key=int)
        for layer in layers:
            ours = f"blocks.{layer}.mlp."
            out[f"model.layers.{layer}.mlp.gate.weight"] = state[ours + "router.weight"]
            out[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.cat([state[ours + "experts.gate"],
                                                                              state[ours + "experts.up"]], dim=1)
            out[f"model.layers.{layer}.mlp.experts.down_proj"] = state[ours + "experts.down"]
        return out

    def from_hf(self, saved: Iterable[str]) -> dict[str, Source]:
        saved = list(saved)
        per_expert: dict[tuple[str, str], dict[int, str]] = {}
        rest, out = [], {}
        for key in saved:
            expert, fused = self.EXPERT.match(key), self.FUSED.match(key)
            if expert:
                layer, e, w = expert.groups()
                per_expert.setdefault((layer, w), {})[int(e)] = key
            elif fused:
                layer, what = fused.groups()
                if what == "gate.weight":
                    out[f"blocks.{layer}.mlp.router.weight"] = Source((key,), _one())
                elif what == "experts.down_proj":
                    out[f"blocks.{layer}.mlp.experts.down"] = Source((key,), _one())
                else:  # gate and up, stacked along the rows of each expert
                    out[f"blocks.{layer}.mlp.experts.gate"] = Source((key,), _one(lambda t: t.chunk(2, dim=1)[0]))
                    out[f"blocks.{layer}.mlp.experts.up"] = Source((key,), _one(lambda t: t.chunk(2, dim=1)[1]))
            else:
                rest.append(key)
        out.update(super().from_hf(rest))
        back = {w: kind for kind, w in self.EXPERTS.items()}
        for (layer, w), keys in per_expert.items():
            if sorted(keys) != list(range(len(keys))):  # a gap: under its own names, which the fit check names
                out.update({k: Source((k,), _one()) for k in keys.values()})
                continue
            out[f"blocks.{layer}.mlp.experts.{back[w]}"] = Source(tuple(keys[e] for e in sorted(keys)),
                                                                   lambda tensors: torch.stack(tensors))
        return out


def adapter(model: Any) -> Adapter:
    """The adapter of a model config of ours (or native_model_keys' values for a Hugging Face config.json)."""
    from contract.rules.hf_native import family

    name = family(model)
    if name == "gpt2":
        return GPT2Adapter()
    heads = int(model.get("n_heads"))
    if name == "mixtral":
        return MixtralAdapter(heads, int(model.get("n_kv_heads") or heads), int(model.get("moe")["num_experts"]))
    return LlamaAdapter(heads, int(model.get("n_kv_heads") or heads))


def with_prefix(adapter: Adapter, key: str) -> str:
    """A saved name as the causal LM names it: a base model's checkpoint (GPT-2's own: `h.0...`) has no prefix."""
    if key.startswith(adapter.prefix) or key.startswith("lm_head."):
        return key
    return adapter.prefix + key
