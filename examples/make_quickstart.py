"""Writes examples/quickstart.ipynb (kept as code so that it stays reviewable)."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("# jupyter-gpumem quickstart\n\nEach section answers one question people ask when a "
       "notebook runs out of GPU memory. Run it on a machine with a CUDA GPU."),
    code("%load_ext gpumem\nimport torch"),
    md("## Why does nvidia-smi show more than my tensors hold?\n\nThe first CUDA call creates "
       "a context (hundreds of MB, *outside PyTorch*); freed tensors stay *reserved* by the "
       "caching allocator."),
    code("%%gpumem\nx = torch.empty(256 << 20, dtype=torch.uint8, device='cuda')"),
    code("%%gpumem\ntmp = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')\ndel tmp"),
    code("%gpumem"),
    md("## `del` vs `empty_cache`\n\n`del` returns memory to PyTorch's cache (allocated "
       "drops, reserved stays); `%gpumem empty-cache` gives the cache back to the driver."),
    code("%%gpumem\ndel x"),
    code("%gpumem empty-cache"),
    md("## The exact peak inside a cell\n\nTemporaries vanish before anyone looks; the peak "
       "comes from the allocator's own counter."),
    code("%%gpumem -o rep\na = torch.randn(4096, 4096, device='cuda')\nb = (a @ a).relu().sum()"),
    code("rep.device(0).peak_above_start, rep.device(0).allocated_delta"),
    md("## Switching caching off\n\nWith caching off every allocation is a direct cudaMalloc,"
       " invisible to PyTorch's counters: the device-level figures show it."),
    code("%gpumem caching off"),
    code("%%gpumem\nu = torch.empty(128 << 20, dtype=torch.uint8, device='cuda')"),
    code("del u\n%gpumem caching on"),
    md("## A leak across cells\n\nKeeping `loss` (not `loss.item()`) in a list keeps every "
       "step's graph alive. Auto mode shows the growth cell by cell."),
    code("%gpumem auto on\nmodel = torch.nn.Linear(2048, 2048).cuda()\nlosses = []"),
    code("for _ in range(10):\n    losses.append(model(torch.randn(1024, 2048, device='cuda')).sum())"),
    code("losses = [l.item() for l in losses]  # the graphs are released"),
    code("%gpumem auto off\n%gpumem history"),
    md("## Would it fit on a 24 GB card?\n\nCap PyTorch's memory; a larger request raises "
       "OutOfMemoryError, and the report still appears."),
    code("%gpumem limit 2GiB"),
    code("%%gpumem\ntry:\n    big = torch.empty(3 << 30, dtype=torch.uint8, device='cuda')\n"
         "except torch.OutOfMemoryError as e:\n    print('OOM as expected:', str(e)[:80])"),
    code("%gpumem limit off"),
    code("import jupyter_gpumem\njupyter_gpumem.history().tail()"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "examples/quickstart.ipynb")
