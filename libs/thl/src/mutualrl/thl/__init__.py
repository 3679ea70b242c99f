"""THL — the Tokenizer Heterogeneity Layer (docs/algorithms.md §3.2, §4).

Moves experience between vocabularies: canonical text from the producer's ids,
the receiver's ids for the same text, byte-offset alignment groups
(many-to-many), transport of token-level traces through them, and a residual
per message saying what could not be carried over exactly.
"""

from mutualrl.thl.alignment import AlignmentGroup, align_spans, token_byte_spans
from mutualrl.thl.batch import convert_batch
from mutualrl.thl.convert import (
    Converted,
    Residual,
    ThlBudget,
    canonical_text,
    convert,
    transport_logprobs,
)

__all__ = [
    "AlignmentGroup",
    "align_spans",
    "token_byte_spans",
    "Converted",
    "Residual",
    "ThlBudget",
    "canonical_text",
    "convert",
    "transport_logprobs",
    "convert_batch",
]
