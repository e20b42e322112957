"""Writes examples/who_holds_it.ipynb (kept as code so that it stays reviewable).

The committed notebook holds the outputs of a run on an H200 (torch 2.11, CUDA 13):
``jupyter-gpumem run examples/who_holds_it.ipynb --output examples/who_holds_it.ipynb``
after writing it with this script. The README quotes them."""

import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell


def failing(source: str) -> nbf.NotebookNode:
    cell = code(source)
    cell.metadata["tags"] = ["raises-exception"]  # the notebook goes on (nbclient, Jupyter)
    return cell


step = "loss = model(xb).square().mean()\ntotal = total + loss"
cells = [
    md("# Who holds the GPU memory?\n\nWhich line leaks, which variable holds the memory, "
       "and what filled the GPU when it ran out. Run it on a machine with a CUDA GPU."),
    code("%load_ext gpumem\nimport torch\n%gpumem track on"),
    md("`%gpumem track on` makes PyTorch's allocator keep the Python stack of each live "
       "block (its cheapest mode). From now on memory has an address: a cell and a line."),
    md("## A leak across cells\n\nSumming `loss` instead of `loss.item()` keeps every "
       "step's autograd graph (its saved activations) alive through `total`. Auto mode "
       "shows after each cell how much it kept and the line that allocated it."),
    code("model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),\n"
         "                            torch.nn.Linear(4096, 1)).cuda()\n"
         "xb = torch.randn(4096, 1024, device='cuda')\n"
         "model(xb).sum().item()  # the first matmul: cuBLAS takes a workspace, kept for good\n"
         "total = torch.zeros((), device='cuda')\n"
         "%gpumem auto on"),
    code(step),
    code(step),
    code(step),
    code("%gpumem auto off\n%gpumem who"),
    md("By line: the line that allocated what is still alive, and who holds it."),
    code("%gpumem who --by line -n 5"),
    md("The fix: keep the number, not the graph."),
    code("total = total.detach()\n%gpumem who -n 5"),
    md("## Out of memory: what filled the GPU, and which fix fits\n\nA cap makes this GPU "
       "behave like a smaller one. When an allocation fails, the report explains it with "
       "numbers and ranks the fixes by whether the failed request would then fit."),
    code("%gpumem limit 2GiB\nacts = [torch.empty(256 << 20, dtype=torch.uint8, device='cuda')"
         " for _ in range(5)]"),
    failing("%%gpumem\nbig = torch.empty(1 << 30, dtype=torch.uint8, device='cuda')"),
    code("%gpumem limit off\ndel acts"),
    md("## A traceback that holds memory\n\nAfter an error IPython keeps the failed frames "
       "(for `%debug`), and with them their tensors."),
    code("def forward():\n    h = torch.empty(512 << 20, dtype=torch.uint8, device='cuda')\n"
         "    raise ValueError('shape mismatch')"),
    failing("%%gpumem\nforward()"),
    code("%gpumem release-traceback"),
    md("## The same data in Python"),
    code("import jupyter_gpumem\njupyter_gpumem.who().head()"),
]
nb = nbf.v4.new_notebook(cells=cells)
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "examples/who_holds_it.ipynb")
