"""Synthetic batches shaped like ImageNet, GLUE and CrowS-Pairs.

No data set can be downloaded here, and the cost this project measures (bytes sealed on
the input path, gradient bytes) depends on shapes and dtypes, not on content. So each
generator reproduces the original's tensor names, shapes, dtypes, value ranges and
rough statistics, deterministically from a ``torch.Generator``. Written by hand because
no maintained library generates data in these formats.

Example::

    from ccddp.workloads.base import generator
    from ccddp.workloads.synthetic import glue_batch

    batch = glue_batch(generator(0, 1, 2), batch_size=4, seq_len=128)
    batch["input_ids"].shape  # torch.Size([4, 128])
"""

from __future__ import annotations

import math

import torch

# torchvision's ImageNet normalisation: real pipelines feed (x/255 - mean) / std.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGENET_CLASSES = 1000

# bert-base-uncased vocabulary: [PAD]=0, [CLS]=101, [SEP]=102; ids below 999 are
# special/unused slots, real word pieces start at 999.
BERT_VOCAB = 30522
BERT_PAD, BERT_CLS, BERT_SEP = 0, 101, 102
BERT_FIRST_WORDPIECE = 999

# GPT-2 byte-level BPE vocabulary; <|endoftext|> = 50256.
GPT2_VOCAB = 50257
GPT2_EOS = 50256


def zipf_tokens(gen: torch.Generator, shape: tuple[int, ...], low: int, high: int) -> torch.Tensor:
    """Token ids in ``[low, high)`` with a Zipf-like (log-uniform rank) distribution.

    Natural text is roughly Zipfian; a log-uniform rank has density ~1/rank, which is
    Zipf with exponent 1, and needs no table over the vocabulary.
    """
    n = high - low
    u = torch.rand(shape, generator=gen, dtype=torch.float64)
    rank = torch.floor(torch.exp(u * math.log(n + 1))).to(torch.long) - 1
    return rank.clamp_(0, n - 1) + low


def imagenet_batch(gen: torch.Generator, batch_size: int, image_size: int,
                   dtype: torch.dtype = torch.float32,
                   num_classes: int = IMAGENET_CLASSES) -> dict[str, torch.Tensor]:
    """``pixel_values`` [B, 3, H, W] normalised like torchvision's ImageNet transform,
    ``labels`` [B] in ``[0, num_classes)``.

    Pixels are smooth random images (upsampled 8x8 noise plus fine noise) in [0, 1], so
    per-channel statistics after normalisation resemble real photos more than white
    noise does.
    """
    coarse = torch.rand((batch_size, 3, 8, 8), generator=gen)
    pixels = torch.nn.functional.interpolate(coarse, size=(image_size, image_size),
                                             mode="bilinear", align_corners=False)
    pixels = (0.8 * pixels + 0.2 * torch.rand(pixels.shape, generator=gen)).clamp_(0.0, 1.0)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return {
        "pixel_values": ((pixels - mean) / std).to(dtype),
        "labels": torch.randint(0, num_classes, (batch_size,), generator=gen),
    }


def glue_batch(gen: torch.Generator, batch_size: int, seq_len: int,
               num_labels: int = 2, vocab_size: int = BERT_VOCAB) -> dict[str, torch.Tensor]:
    """A GLUE sentence-pair batch as ``run_glue`` tokenises it, padded to ``seq_len``.

    ``[CLS] sentence A [SEP] sentence B [SEP] [PAD]...``: ``token_type_ids`` mark
    sentence B, ``attention_mask`` marks real tokens, ``labels`` are in
    ``[0, num_labels)``. Real lengths vary between half and all of ``seq_len``.
    """
    ids = zipf_tokens(gen, (batch_size, seq_len), BERT_FIRST_WORDPIECE, vocab_size)
    mask = torch.zeros((batch_size, seq_len), dtype=torch.long)
    types = torch.zeros((batch_size, seq_len), dtype=torch.long)
    min_len = min(seq_len, max(3, seq_len // 2))
    lengths = torch.randint(min_len, seq_len + 1, (batch_size,), generator=gen)
    for i, n in enumerate(lengths.tolist()):
        # Sentence A takes 30-70 % of the real tokens; the rest is sentence B.
        split = max(1, min(n - 2, int(n * (0.3 + 0.4 * torch.rand((), generator=gen).item()))))
        ids[i, 0] = BERT_CLS
        ids[i, split] = BERT_SEP
        ids[i, n - 1] = BERT_SEP
        ids[i, n:] = BERT_PAD
        mask[i, :n] = 1
        types[i, split + 1:n] = 1
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "token_type_ids": types,
        "labels": torch.randint(0, num_labels, (batch_size,), generator=gen),
    }


def crows_pairs_batch(gen: torch.Generator, batch_size: int, seq_len: int,
                      vocab_size: int = GPT2_VOCAB) -> dict[str, torch.Tensor]:
    """A causal-LM block as Hugging Face's ``run_clm`` builds it from CrowS-Pairs text.

    ``run_clm`` concatenates the sentences and cuts ``seq_len``-token blocks, so there is
    no padding: ``input_ids`` [B, T] are BPE ids with an ``<|endoftext|>`` between
    sentences (CrowS-Pairs sentences are ~20 tokens), ``labels`` equal ``input_ids``
    (the model shifts them), ``attention_mask`` is all ones.
    """
    ids = zipf_tokens(gen, (batch_size, seq_len), 0, vocab_size - 1)
    # Sentence boundaries every 12-28 tokens.
    for i in range(batch_size):
        pos = int(torch.randint(12, 29, (), generator=gen))
        while pos < seq_len:
            ids[i, pos] = GPT2_EOS
            pos += int(torch.randint(12, 29, (), generator=gen))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones((batch_size, seq_len), dtype=torch.long),
        "labels": ids.clone(),
    }
