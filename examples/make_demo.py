"""Writes examples/demo.ipynb, the notebook `jupyter-gpumem demo` opens (kept as code so
that it stays reviewable). Its outputs come from running it on a GPU:

    python3 examples/make_demo.py && python3 examples/execute.py examples/demo.ipynb
"""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def raises(source: str) -> nbf.NotebookNode:
    cell = code(source)
    cell.metadata["tags"] = ["raises-exception"]  # Run All goes on past it
    return cell


cells = [
    md(
        "# jupyter-gpumem: a tour\n\n"
        "Each section shows one thing the tool does, with the output it gave on a GPU "
        "(the machine is named in the first report). Open the **GPU memory** panel from the "
        "right sidebar, or click the GPU figures in the status bar.\n\n"
        "**Without a GPU** (`make demo` or `jupyter-gpumem demo`): the kernel plays back a "
        "recording of this notebook made on an NVIDIA H200. Running a cell shows what it "
        "showed there, and the panel, the status bar and the history move through the "
        "readings recorded while it ran, so that the notebook, the panel and `%gpumem` agree; "
        "every output says **replay**. *Run All* plays the whole tour. A cell you edit or add "
        "is not in the recording: it runs for real on this machine, and its report says what "
        "this machine has (no GPU, or a CPU-only torch), not replayed figures."
    ),
    code(
        "%load_ext gpumem\n"
        "import torch\n"
        "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
        "MiB = 1 << 20"
    ),
    md(
        "## 1. What a cell did to GPU memory\n\n"
        "`%%gpumem` runs the cell as usual, then reports: **allocated** (live tensors) and "
        "**reserved** (what PyTorch's caching allocator keeps) before and after, the exact "
        "**peak** inside the cell (from the allocator's own counter, not sampled), what the "
        "process holds **outside PyTorch** (the CUDA context, cuBLAS), cudaMalloc calls and "
        "fragmentation. Here the cell keeps 256 MiB and frees a 768 MiB temporary: "
        "allocated rises by 256 MiB, reserved by 1 GiB (the freed block stays cached), and "
        "the peak is 1 GiB above the start."
    ),
    code(
        "%%gpumem\n"
        "x = torch.empty(256 * MiB, dtype=torch.uint8, device=device)\n"
        "tmp = torch.empty(768 * MiB, dtype=torch.uint8, device=device)\n"
        "del tmp"
    ),
    md(
        "`%gpumem` shows where every device stands now. *device used* is what `nvidia-smi` "
        "counts (all processes); the difference to *reserved* is the CUDA context and the "
        "libraries, and the cache."
    ),
    code("%gpumem"),
    md(
        "## 2. Who holds the memory\n\n"
        "`%gpumem track on` asks PyTorch to record where each live block was allocated "
        "(about 1 µs per allocation). A classic leak: adding up `loss` instead of "
        "`loss.item()` keeps every step's autograd graph, with its saved activations."
    ),
    code(
        "%gpumem track on\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(),\n"
        "                            torch.nn.Linear(4096, 1)).to(device)\n"
        "xb = torch.randn(4096, 4096, device=device)\n"
        "total = 0"
    ),
    code("for step in range(3):\n    loss = model(xb).square().mean()\n    total = total + loss"),
    md(
        "`%gpumem who` names the owners of the live memory: variables, module parameters, "
        "optimizer state, `Out[N]`, the last error's traceback, and the autograd graph a "
        "variable keeps. The rows add up to *allocated*. `--by line` groups by the line "
        "that allocated each block."
    ),
    code("%gpumem who"),
    code("%gpumem who --by line"),
    code("total = total.item()  # the graphs and their activations are released\n%gpumem"),
    md(
        "## 3. Why it ran out of memory\n\n"
        "`%gpumem limit` caps what PyTorch may use, to try a smaller card. A cell that "
        "raises `OutOfMemoryError` gets a post-mortem: the request, what filled the GPU, "
        "what the cell needed, and the fixes, each judged against that need."
    ),
    code("%gpumem limit 2GiB"),
    raises(
        "%%gpumem\n"
        "acts = torch.empty(512 * MiB, dtype=torch.uint8, device=device)\n"
        "big = torch.empty(2048 * MiB, dtype=torch.uint8, device=device)"
    ),
    code("%gpumem release-traceback\ndel acts\n%gpumem limit off"),
    md(
        "## 4. Fragmentation: the segment map\n\n"
        "Freeing every other block leaves free pieces inside segments that still hold live "
        "blocks: `empty_cache` cannot return them. `%gpumem segments` draws every segment "
        "and its blocks to scale; hover a block for its size and the line that allocated it."
    ),
    code(
        "blocks = [torch.empty(64 * MiB, dtype=torch.uint8, device=device) for _ in range(16)]\n"
        "del blocks[::2]\n"
        "%gpumem segments"
    ),
    md(
        "## 5. The history\n\n"
        "Every measured cell is kept (about 155 bytes each): `%gpumem history` lists them, "
        "`--plot` draws them, and `jupyter_gpumem.history()` returns a DataFrame. The panel's "
        "History tab shows the same rows. Auto mode (`%gpumem auto on`) measures every cell."
    ),
    code("%gpumem history"),
    code("%gpumem history --plot"),
    md(
        "## 6. The largest batch that fits\n\n"
        "`%%gpumem --scan NAME=V1,V2,V3` runs the cell once per value, fits its peak, "
        "predicts the largest value that fits the target (`--fit-in 24GiB` or a card name "
        "such as `RTX4090`) and verifies it with a real run under that cap."
    ),
    code(
        "del blocks, model, xb\n"
        "net = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),\n"
        "                          torch.nn.Linear(4096, 1024)).to(device)\n"
        "opt = torch.optim.AdamW(net.parameters())"
    ),
    code(
        "%%gpumem --scan batch=8192,16384,32768 --fit-in 4GiB\n"
        "out = net(torch.randn(batch, 1024, device=device)).square().mean()\n"
        "out.backward()\n"
        "opt.step()\n"
        "opt.zero_grad(set_to_none=True)\n"
        "del out"
    ),
    md(
        "## Next\n\n"
        "- `%%gpumem --breakdown`: what a training step's peak is made of (parameters, "
        "gradients, optimizer state, activations), `examples/before_you_run.ipynb`.\n"
        "- `%%gpumem --trace`: a cell's allocations over time.\n"
        "- `jupyter-gpumem run notebook.ipynb --budget 'peak<=20GiB'`: budgets in CI.\n"
        "- `%gpumem?` and `%%gpumem?`: every option."
    ),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "examples/demo.ipynb")
