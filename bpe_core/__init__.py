"""bpe_core: exact, fast, RAM-budgeted byte-level BPE training and corpus encoding.

This is the public API.
"""
from .config import TrainConfig
from .encode_corpus import encode_corpus
from .model_io import Model, load_model as load
from .pretokenize import pretokenize
from .tokenizer import Tokenizer
from .trainer import TrainResult, train, train_bpe

__version__ = "0.1.0"

__all__ = ["TrainConfig", "Model", "TrainResult", "Tokenizer", "encode_corpus", "load", "pretokenize",
           "train", "train_bpe", "__version__"]
