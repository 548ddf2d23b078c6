"""Fixtures shared by the test files: tiny random models written once per test session."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from demo import make_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random-weight Qwen2 model (hidden 64, 2 layers, head size 32, vocab 128, tied) with the
    character tokenizer, in a transformers-format directory that transformers and vLLM load.
    Read-only: a test that changes weights works on its own copy."""
    return make_tiny_model(str(tmp_path_factory.mktemp("tiny_model")), hidden=64, layers=2,
                           heads=2, kv_heads=1, intermediate=128, vocab_size=128, seed=0)
