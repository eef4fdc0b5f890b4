"""Every notebook, executed top to bottom on the GPU (nbclient), with a `dummy:` model.

On the CPU `make test` runs the notebooks in a real browser with their default model. Here each
notebook takes its model from `WORKBENCH_MODEL` (default for this test: dummy Qwen3-0.6B, a real
architecture with random weights) and must run without an error output. The executed copies go
to `out/gpu-notebooks/`, and what each printed is printed here (run with -s).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("*.ipynb"))
OUT = Path(__file__).parents[1] / "out" / "gpu-notebooks"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_on_the_gpu(path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    model = os.environ.get("WORKBENCH_MODEL", "dummy:qwen3-0.6b")
    monkeypatch.setenv("WORKBENCH_MODEL", model)  # the kernel inherits it
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    try:
        client.execute()
    finally:
        OUT.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, OUT / path.name)
    seconds = time.perf_counter() - start
    printed = []
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            assert output.output_type != "error", f"{path.name}: {output.ename}: {output.evalue}"
            if output.output_type == "stream" and output.name == "stdout":
                printed.append(output.text.strip())
    cells = sum(cell.cell_type == "code" for cell in nb.cells)
    print(f"\nnotebook {path.name}: {cells} cells ran in {seconds:.1f} s on {model}")
    for text in printed:
        print("  | " + text.replace("\n", "\n  | "))
