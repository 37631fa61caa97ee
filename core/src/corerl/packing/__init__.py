"""Sequence packing: which sequences share a row (a bin of at most ``budget`` tokens).

A packer is what a :class:`corerl.registry.SequencePacker` factory returns: an object with
``pack(lengths, budget) -> bins`` (see :class:`corerl.packing.contract.Packer`). The core's
own packers live in :mod:`corerl.packing.algorithms`; turning bins into model inputs is
:mod:`corerl.training.microbatching`'s job.
"""

from corerl.packing.contract import Packer, check_bins

__all__ = ["Packer", "check_bins"]
