"""The ``"superbpe"`` method of the registry (:class:`SuperBPE`: its checks, training, stage-aware
encoder and export notes) and the check of the stage-2 marks a model file carries
(:func:`check_stage_marks`, shared with SupraTok). Registered when ``bpe_core`` is imported. The encoder
and the export's split are imported where they are used: a training run needs neither."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...errors import ModelFormatError
from ...formats import registry
from ...formats.model import Model
from .rules import SPLITS, model_split, normal_split, resolve_transition, valid_rules
from .train import train_superbpe

if TYPE_CHECKING:
    from .encoder import StageAwareEncoder


def check_stage_marks(path: str, model: Model) -> None:
    """The stage-2 marks SuperBPE and SupraTok write: a known ``"split"``, well-formed ``"rules"``."""
    for k, st in enumerate(model.stages):
        if "split" in st and st["split"] not in SPLITS:
            raise ModelFormatError(path, f"field 'stages': stage {k} \"split\" must be one of {', '.join(SPLITS)}")
        rules = st.get("rules")
        if rules is not None and not valid_rules(rules):
            raise ModelFormatError(path, f"field 'stages': stage {k} \"rules\" is malformed")


class SuperBPE(registry.Method):
    """SuperBPE (Liu et al., 2025): BPE up to the transition, then merges across whitespace."""

    name = "superbpe"
    n_stages = 2
    stage_aware = True
    supports_init = True
    records_pretokens = True

    def check_config(self, config) -> None:
        resolve_transition(config.transition, config.vocab_size, len(config.special_tokens))
        if config.tie_break != "bytes":
            raise ValueError(f"tie_break {config.tie_break!r} is for plain BPE (method 'bpe'); superbpe breaks ties by bytes")
        if config.min_pretoken_count > 1:
            raise ValueError(f"min_pretoken_count {config.min_pretoken_count} is for plain BPE: stage 2 joins "
                             "pretokens into units and needs every pretoken's stage-1 tokens (leave it at 1)")

    def reads_input_again(self, config, sources) -> bool:
        # On a cluster, or with URL inputs, stage 2 counts its units over the same shards
        # (count_units_on) instead of a spooled copy on this machine. That needs a separator between
        # items (else the spooled corpus decides: it refuses several items).
        if config.cluster is None and not any(s.is_url for s in sources):
            return True
        return normal_split(config.stage2_split) == "official" or not config.special_tokens

    def uses_record(self, config) -> bool:
        # the official split pre-tokenizes the file again with its own regex (official_units)
        return normal_split(config.stage2_split) != "official"

    def train(self, config, table, plan, progress=False, init=None, recorded=None) -> registry.MethodResult:
        report: dict = {"seconds": {}}
        vocab, merges, stages = train_superbpe(config, table, report, plan, progress=progress,
                                               init_merges=init.merges if init is not None else None,
                                               recorded=recorded)
        return registry.MethodResult(vocab, merges, stages, report)

    def check_stages(self, path: str, model: Model) -> None:
        check_stage_marks(path, model)

    def stage_encoder(self, model: Model) -> "StageAwareEncoder":
        from .encoder import StageAwareEncoder

        return StageAwareEncoder(model)

    def hf_split_pattern(self, model: Model) -> str:
        from .export import hf_split_regex

        return hf_split_regex(model)[0]

    def export_caveats(self, model: Model, fmt: str) -> list[str]:
        from .export import hf_split_regex

        exact = hf_split_regex(model)[1]
        what = {"hf": ("tokenizer.json splits into the model's stage-2 units" if exact else
                       "tokenizer.json splits with the closest regex to the model's stage-2 split "
                       f"({model_split(model)!r} with pattern {model.pattern_name or 'a custom regex'!r} is not "
                       "expressible)")
                      + " and applies all merges by rank inside each piece (one stage)",
                "tiktoken": "tiktoken splits with the stage-1 pattern, so no token crosses a pretoken "
                            "boundary and stage-2 tokens are never produced",
                "gpt2": "vocab.json/merges.txt carry no pre-tokenizer or stages"}.get(fmt, "")
        return [f"this is a SuperBPE model: {what}; ids can differ from bpe_core's stage-aware encoder "
                f"(Tokenizer.load / model.json), which reproduces training exactly (see docs/superbpe.md)"]


registry.register(SuperBPE())
