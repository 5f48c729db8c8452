"""A Hugging Face Trainer run on CPU ranks, as a user writes one: a small BERT classifier
(random init, no download) on synthetic data. It names no backend (Accelerate picks gloo
for CPU ranks); ``ccddp launch`` serves that with ccddp, unchanged.

    torchrun --nproc-per-node 2 tests/hf_trainer_main.py OUTDIR
    ccddp launch --nproc-per-node 2 tests/hf_trainer_main.py OUTDIR
"""

import os
import sys

import torch
import torch.distributed as dist
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Synthetic(torch.utils.data.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 100, (16,), generator=g), "labels": torch.tensor(i % 2)}


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(config)
    args = TrainingArguments(output_dir=out, use_cpu=True, per_device_train_batch_size=4, max_steps=4,
                             learning_rate=1e-3, logging_steps=2, save_strategy="no", report_to=[],
                             seed=0, data_seed=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=Synthetic())
    result = trainer.train()
    params = torch.cat([p.detach().float().view(-1) for p in model.parameters()])
    rank = dist.get_rank()
    torch.save({"backend": dist.get_backend(), "loss": result.training_loss, "params": params},
               os.path.join(out, f"rank{rank}.pt"))


if __name__ == "__main__":
    main()
