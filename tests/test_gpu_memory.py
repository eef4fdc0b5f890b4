"""GPU memory: KV pool sizing from free memory, and refusing a model that does not fit."""

from __future__ import annotations

import pytest
import torch

from workbench import LLM
from workbench.models import resolve

from .conftest import MODEL

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_memory_sizing_uses_free_memory():
    free_before, total = torch.cuda.mem_get_info()
    engine = LLM(MODEL, memory_ratio=0.5, max_running_reqs=8, cuda_graph_max_bs=8).engine
    kv = engine.pool.nbytes
    weights = engine.model_config.num_params() * 2
    print(
        f"\nmemory: {free_before / 2**30:.1f} GiB free before, weights {weights / 2**30:.2f} GiB, "
        f"KV pool {kv / 2**30:.1f} GiB ({engine.num_pages} pages) at memory_ratio 0.5"
    )
    assert 0.4 * (free_before - weights) < kv < 0.55 * (free_before - weights)
    del engine


def test_a_model_that_does_not_fit_is_refused(tmp_path):
    import json
    import shutil

    src = resolve("dummy:qwen3-8b")
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = 2000  # about 400B parameters
    (tmp_path / "config.json").write_text(json.dumps(config))
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, tmp_path / f.name)
    with pytest.raises(ValueError, match="needs .* GiB for its weights"):
        LLM(str(tmp_path), num_pages=16, max_running_reqs=4)
