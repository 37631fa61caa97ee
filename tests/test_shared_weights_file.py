"""Weights through a shared-memory file: exact, written once per storage, seen by another process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

from corerl.generation.shared_weights import SharedWeightWriter, read_shared


def test_a_round_trip_is_exact_and_tied_tensors_are_written_once():
    writer = SharedWeightWriter()
    try:
        embed = torch.randn(7, 5)
        weights = [("embed", embed), ("norm", torch.rand(5, dtype=torch.bfloat16)), ("head", embed),
                   ("ids", torch.arange(3))]
        manifest = writer.write(weights)
        offsets = {name: offset for name, _, _, offset in manifest.entries}
        assert offsets["embed"] == offsets["head"]  # one copy for both names
        back = dict(read_shared(manifest))
        assert all(torch.equal(back[name], tensor) and back[name].dtype == tensor.dtype for name, tensor in weights)
        larger = torch.randn(70, 5)
        bigger = writer.write([("embed", larger)])  # the file grows when it must
        assert bigger.size > manifest.size and torch.equal(dict(read_shared(bigger))["embed"], larger)
    finally:
        writer.close()
    import os

    assert not os.path.exists(writer.path)


READER = textwrap.dedent(
    """
    import pickle, sys, torch
    from corerl.generation.shared_weights import read_shared
    manifest = pickle.loads(bytes.fromhex(sys.argv[1]))
    print(float(sum(t.double().sum() for _, t in read_shared(manifest))))
    """
)


def test_another_process_reads_what_was_written():
    import pickle

    writer = SharedWeightWriter()
    try:
        weights = [("a", torch.randn(64, 32)), ("b", torch.randn(10))]
        manifest = writer.write(weights)
        proc = subprocess.run([sys.executable, "-c", READER, pickle.dumps(manifest).hex()], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert abs(float(proc.stdout) - float(sum(t.double().sum() for _, t in weights))) < 1e-9
    finally:
        writer.close()
