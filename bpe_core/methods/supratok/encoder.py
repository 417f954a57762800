"""The SupraTok encoder: pass-1 merges inside pretokens, then passes 2 and 3 in rank order inside units."""
from __future__ import annotations

import dataclasses
import numpy as np
from typing import Sequence


from ...formats.model import Model
from ..superbpe import StageAwareEncoder


# ==== Encoding =================================================================================


class SupraTokEncoder:
    """Encode with a SupraTok model: pass-1 merges inside pretokens, then the pass-2 and pass-3 merges
    in rank order inside units (SuperBPE's stage-aware encoder on the same stage split)."""

    def __init__(self, model: Model):
        if model.method != "supratok":
            raise ValueError(f"not a SupraTok model (method {model.method!r})")
        n1 = int(model.stages[0]["merges"])
        inner = dataclasses.replace(model, method="superbpe",
                                    stages=[{"name": "bpe", "merges": n1},
                                            {"name": "superbpe", "merges": len(model.merges) - n1}])
        self.model = model
        self._enc = StageAwareEncoder(inner)

    @property
    def native(self):
        """The whole-text native encoder (``encode.TwoStageEncoder``, the ``"units"`` split), or None
        for a pattern without a native scanner."""
        return self._enc.native

    def encode_array(self, data: bytes, specials: bool = True) -> np.ndarray:
        """uint32 ids of ``data`` in one native call (``specials=False``: as :meth:`encode_ordinary`)."""
        return self._enc.encode_array(data, specials)

    def encode_ordinary(self, data: bytes) -> np.ndarray:
        return self._enc.encode_ordinary(data)

    def encode(self, data: bytes | str) -> list[int]:
        return self._enc.encode(data)

    def encode_python(self, data: bytes | str) -> list[int]:
        """The plain path (numpy and ``RankMerger`` per text piece), the twin of the native one."""
        return self._enc.encode_python(data)

    def decode(self, ids: Sequence[int]) -> bytes:
        vocab = self.model.vocab
        return b"".join(vocab[i] for i in ids)
