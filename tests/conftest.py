import os
import sys

# Rank functions live in test modules; spawned ranks import them from here.
sys.path.insert(0, os.path.dirname(__file__))

# Triton chooses compiled or interpreted kernels once, when it is first imported: without
# a GPU the device AES-GCM tests run its kernels through the interpreter, decided here
# before any test (or library) can import Triton. Spawned ranks inherit the choice.
from ccddp.crypto.device import interpreting  # noqa: E402

interpreting()
