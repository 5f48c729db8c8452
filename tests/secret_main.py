"""Where the group secret may reach (``ccddp launch ... secret_main.py OUT``).

The script does what training scripts do with their environment: it logs ``os.environ``
and starts a subprocess and a data-loader worker, which report what they inherited. Each
rank writes what it saw to ``OUT/rank{r}.txt`` and prints it; the test then searches
everything the launch printed or wrote for the secret. Each rank also saves the
environment blocks ``environ_main.py`` saves, so that one launch serves both tests.
"""

from __future__ import annotations

import os
import subprocess
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset


class WorkerEnvironment(Dataset):
    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> str:
        return os.environ.get("CCDDP_GROUP_SECRET", "<absent>")


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    lines = [f"environment: {dict(os.environ)}"]
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('CCDDP_GROUP_SECRET', '<absent>'))"],
                           capture_output=True, text=True, check=True)
    lines.append(f"subprocess sees: {child.stdout.strip()}")
    lines.append(f"data-loader worker sees: {next(iter(DataLoader(WorkerEnvironment(), num_workers=1)))[0]}")
    t = torch.ones(8)
    dist.all_reduce(t)
    lines.append(f"all_reduce: {t.tolist()}")
    with open(os.path.join(out, f"rank{rank}.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    from environ_main import save_blocks

    save_blocks(out)        # what environ_main.py saves, read by the environment-block test
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
