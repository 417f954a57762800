"""Stage 4: model files, and the table of methods that gives them meaning.

- ``model``: the ``Model`` (vocab, ordered merges, special tokens, pattern, method, stages), the
  native ``model.json``, GPT-2 ``vocab.json`` + ``merges.txt``, and their checks on load;
- ``registry``: the training methods by name (``methods/`` registers them).
"""
from .model import (MERGES_FILE, MODEL_FILE, VOCAB_FILE, Model, check_model, dump_folder, dump_gpt2, dump_model,
                    load_any, load_gpt2, load_model)

__all__ = ["MERGES_FILE", "MODEL_FILE", "VOCAB_FILE", "Model", "check_model", "dump_folder", "dump_gpt2",
           "dump_model", "load_any", "load_gpt2", "load_model"]
