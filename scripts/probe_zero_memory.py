"""Where ZeRO-1/2's CUDA peak goes at world size 1: a bare DeepSpeed engine over bench/plan_accuracy.py's
76M model, each phase's allocated and peak bytes in units of the fp32 parameter bytes P, with torch's
AdamW multi-tensor (foreach=None, as the deepspeed backend builds it) and per-tensor (foreach=False).
A diagnostic for the deepspeed memory model on a lent GPU (log: bench/results/gpu/zero12_memory_probe-h200.log);
not part of the suite:

    source .gpu/setup.sh && python scripts/probe_zero_memory.py
"""

import gc
import os
import tempfile

import deepspeed
import torch
from transformers import AutoModelForCausalLM

from corerl.models.tiny import build_tiny_model

MiB = 2**20


def probe(path: str, stage: int, foreach: bool | None) -> None:
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = AutoModelForCausalLM.from_pretrained(path).cuda()
    p_mib = sum(p.numel() for p in model.parameters()) * 4 / MiB
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)
    config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
              "zero_force_ds_cpu_optimizer": False}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

    def mark(what: str) -> None:
        allocated = (torch.cuda.memory_allocated() - base) / MiB
        peak = (torch.cuda.max_memory_allocated() - base) / MiB
        print(f"stage {stage} foreach={foreach} {what:6s} allocated {allocated:8.1f} ({allocated / p_mib:5.2f} P) "
              f"peak {peak:8.1f} ({peak / p_mib:5.2f} P)", flush=True)
        torch.cuda.reset_peak_memory_stats()

    mark("init")
    for step in range(2):
        ids = torch.randint(0, 128, (4, 32), device="cuda")
        loss = engine(input_ids=ids, labels=ids).loss
        mark(f"fwd{step}")
        engine.backward(loss)
        mark(f"bwd{step}")
        engine.step()
        mark(f"step{step}")
    print("P MiB", p_mib)


def main() -> None:
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
    deepspeed.init_distributed("nccl")
    path = str(build_tiny_model(tempfile.mkdtemp() + "/m", hidden_size=1024, num_layers=8))
    for stage in (1, 2):
        for foreach in (None, False):
            probe(path, stage, foreach)
            gc.collect()


if __name__ == "__main__":
    main()
