"""Stage 5: encoding text with a trained model.

- ``tokenizer``: ``Tokenizer`` (encode, decode, streams, batches) over the native encoder ``_encode``,
  and ``StageAwareTokenizer`` for multi-stage models (the stage encoder comes from the method);
- ``encode_corpus``: a whole file into one flat ``.npy`` of ids, on worker threads, in bounded memory.
"""
from .tokenizer import StageAwareTokenizer, Tokenizer

__all__ = ["StageAwareTokenizer", "Tokenizer"]
