import os
import sys

# Rank functions live in test modules; spawned ranks import them from here.
sys.path.insert(0, os.path.dirname(__file__))
