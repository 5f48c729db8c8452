"""BERT (GLUE) and GPT-2 (CrowS-Pairs) workloads of the paper's Table I.

Architectures are ``transformers``' ``BertForSequenceClassification`` (2 labels, as for
a GLUE pair task such as MRPC) and ``GPT2LMHeadModel`` (causal LM, the input embedding
tied to the LM head as in the released checkpoints), configured with the published
hyperparameters of bert-base/large-uncased and gpt2-large/xl, randomly initialised.

Example::

    from ccddp.workloads import get_workload

    wl = get_workload("gpt2-xl", size="tiny")
    model = wl.build_model()
    loss = wl.loss(model, wl.make_batch(step=0, rank=0, world_size=2))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ccddp.workloads.base import Workload, int_setting
from ccddp.workloads.synthetic import BERT_VOCAB, GPT2_VOCAB, crows_pairs_batch, glue_batch

# Published hyperparameters (the config.json of each released checkpoint).
BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
             "intermediate_size": 3072}
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
              "intermediate_size": 4096}
BERT_TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64}
GPT2_LARGE = {"n_embd": 1280, "n_layer": 36, "n_head": 20}
GPT2_XL = {"n_embd": 1600, "n_layer": 48, "n_head": 25}
GPT2_TINY = {"n_embd": 32, "n_layer": 2, "n_head": 2}


class BertWorkload(Workload):
    """BERT sequence-pair classification (GLUE), cross-entropy over 2 labels."""

    family = "language"

    def _validate(self) -> None:
        int_setting(self.settings, "seq_len", 4, 512)  # BERT's 512 positions

    def _create_model(self) -> torch.nn.Module:
        from transformers import BertConfig, BertForSequenceClassification

        s = self.settings
        config = BertConfig(
            vocab_size=BERT_VOCAB,
            hidden_size=int(s["hidden_size"]),
            num_hidden_layers=int(s["num_hidden_layers"]),
            num_attention_heads=int(s["num_attention_heads"]),
            intermediate_size=int(s["intermediate_size"]),
            max_position_embeddings=512,
            type_vocab_size=2,
            num_labels=int(s["num_labels"]),
        )
        return BertForSequenceClassification(config)

    def make_batch(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        gen = self._chunk_generator(step, rank, world_size)
        s = self.settings
        return glue_batch(gen, self.batch_size, int(s["seq_len"]), num_labels=int(s["num_labels"]))

    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                     token_type_ids=batch["token_type_ids"], labels=batch["labels"]).loss


class GPT2Workload(Workload):
    """GPT-2 causal language modelling on CrowS-Pairs-like text."""

    family = "language"

    def _validate(self) -> None:
        int_setting(self.settings, "seq_len", 2, 1024)  # GPT-2's 1024 positions

    def _create_model(self) -> torch.nn.Module:
        from transformers import GPT2Config, GPT2LMHeadModel

        s = self.settings
        config = GPT2Config(
            vocab_size=GPT2_VOCAB,
            n_positions=1024,
            n_embd=int(s["n_embd"]),
            n_layer=int(s["n_layer"]),
            n_head=int(s["n_head"]),
        )
        model = GPT2LMHeadModel(config)
        # transformers infers the loss from the class name, which for GPT2LMHeadModel
        # fails (with a warning) before falling back to this same loss.
        model.loss_type = "ForCausalLM"
        return model

    def make_batch(self, step: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        gen = self._chunk_generator(step, rank, world_size)
        return crows_pairs_batch(gen, self.batch_size, int(self.settings["seq_len"]))

    def loss(self, model: torch.nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"),
                     labels=batch["labels"]).loss


def _bert(arch: dict[str, int], batch_size: int, seq_len: int) -> dict[str, Any]:
    return {"batch_size": batch_size, "seq_len": seq_len, "dtype": "float32", "seed": 0,
            "num_labels": 2, **arch}


def _gpt2(arch: dict[str, int], seq_len: int, dtype: str) -> dict[str, Any]:
    return {"batch_size": 1, "seq_len": seq_len, "dtype": dtype, "seed": 0, **arch}


class BertBase(BertWorkload):
    PRESETS = {"default": _bert(BERT_BASE, batch_size=4, seq_len=128),
               "tiny": _bert(BERT_TINY, batch_size=2, seq_len=16)}


class BertLarge(BertWorkload):
    PRESETS = {"default": _bert(BERT_LARGE, batch_size=2, seq_len=128),
               "tiny": _bert({**BERT_TINY, "num_hidden_layers": 3}, batch_size=2, seq_len=16)}


class GPT2Large(GPT2Workload):
    PRESETS = {"default": _gpt2(GPT2_LARGE, seq_len=64, dtype="float32"),
               "tiny": _gpt2(GPT2_TINY, seq_len=16, dtype="float32")}


class GPT2XL(GPT2Workload):
    DTYPE_REASON = (
        "memory: 1.56e9 fp32 parameters + gradients are 12.5 GB per rank (18.7 GB with "
        "DDP's separate bucket copies), over 24 GB for two ranks; bfloat16 halves it")
    # bfloat16 storage, float32 matmuls: bf16 GEMMs are ~10x slower than fp32 on CPUs
    # without AVX512-BF16/AMX (ccddp.workloads.precision). 32 tokens: one fwd+bwd is
    # ~15 s on one core; GPT2-Large affords 64 in ~11 s.
    PRESETS = {"default": {**_gpt2(GPT2_XL, seq_len=32, dtype="bfloat16"), "matmul_dtype": "float32"},
               "tiny": {**_gpt2({**GPT2_TINY, "n_layer": 3}, seq_len=16, dtype="bfloat16"),
                        "matmul_dtype": "float32"}}
