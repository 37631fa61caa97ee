"""TORCH_CUDA_ARCH_LIST with architecture suffixes (the H100 image sets 9.0a): rewritten to a
list DeepSpeed's own op builder parses, checked against that parser."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from corerl_deepspeed.cuda_arch import parseable_arch_list

PARSE = textwrap.dedent(
    """
    import os, sys
    os.environ["DS_ACCELERATOR"] = "cpu"
    os.environ["TORCH_CUDA_ARCH_LIST"] = sys.argv[1]
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    # the real filter asks the installed CUDA toolkit (none here) which archs it supports; keep them all
    CUDAOpBuilder.filter_ccs = lambda self, ccs: [cc.split(".") for cc in ccs]
    print(builder.compute_capability_args(), os.environ["TORCH_CUDA_ARCH_LIST"])
    """
)


def _deepspeed_parses(arch_list: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PARSE, arch_list], capture_output=True, text=True, timeout=120)


def test_suffixes_are_dropped_and_ptx_kept():
    assert parseable_arch_list("9.0a") == "9.0"
    assert parseable_arch_list("8.0 9.0a;10.0f+PTX") == "8.0;9.0;10.0+PTX"
    assert parseable_arch_list("9.0;9.0a") == "9.0"
    assert parseable_arch_list(" 8.6 ") == "8.6"


def test_deepspeed_rejects_the_suffix_and_parses_the_rewritten_list():
    broken = _deepspeed_parses("9.0a")
    assert broken.returncode != 0 and "invalid literal for int() with base 10: '0a'" in broken.stderr
    fixed = _deepspeed_parses(parseable_arch_list("9.0a"))
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    assert fixed.stdout.split()[-1] == "9.0+PTX"
