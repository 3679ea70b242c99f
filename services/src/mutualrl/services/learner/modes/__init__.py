"""The sharing modes, one class each, registered once under their names (docs/algorithms.md §3.3).

``none`` (isolated), ``naive``, ``prp``, ``xgrpo``, ``sgt``, ``sgt_r`` and ``hacpo``; a new mode is a new
module here with a :class:`SharingMode` subclass, its name added to ``sharing.mode``'s literal
(a test checks the two agree) and, when it has settings, a ``sharing.<name>`` section.
"""

from mutualrl.services.learner.modes import (  # noqa: F401  (each registers its mode)
    hacpo,
    isolated,
    naive,
    prp,
    sgt,
    sgt_r,
    xgrpo,
)
from mutualrl.services.learner.modes.base import (
    MODES,
    SharingMode,
    consecutive_minibatches,
    make_mode,
    record_keys,
    register_mode,
)

__all__ = ["MODES", "SharingMode", "consecutive_minibatches", "make_mode", "record_keys", "register_mode"]
